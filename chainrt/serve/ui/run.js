// chainrt dashboard: one run. The budget waterfall (one bar per step on a shared time axis:
// allotted vs elapsed, concurrency waits, attempts with retries and fallbacks marked, skipped
// optional steps greyed), input/output/errors, trace link, Resume and Cancel, and live updates
// from the run's event stream (tokens of the step in flight when the step streams). A run parked
// at a wait shows a form that sends the signal it waits for (POST /v1/runs/{id}/signal).
"use strict";
(function () {
  const { el, api, ms, statusBadge, valueBlock } = window.chainrt;
  const runId = decodeURIComponent(location.pathname.replace(/^\/ui\/runs\//, ""));
  // At rest: nothing will change the page until someone acts (a parked run waits for a signal).
  const FINAL = new Set(["completed", "partial", "rejected", "failed", "cancelled", "waiting"]);
  const RESUMABLE = new Set(["partial", "failed", "rejected", "cancelled"]);
  const $ = (id) => document.getElementById(id);
  let detail = null; // GET /v1/runs/{id}/record
  let live = {}; // step id -> {started, allotted_ms, attempts: [], tokens: ""} for steps in flight
  let source = null;
  let ticker = null;

  function setMessage(text) {
    $("message").textContent = text;
  }

  // Where each step sits on the shared axis (seconds since the first step started).
  // Steps run one after the other: while the run is running, the first step without a record
  // is the one in flight. Its step_started event may have gone out before this page opened; it
  // is drawn from the end of the step before it (or the run's last write) until its own event
  // or record arrives.
  function inFlight(records) {
    if (detail.status !== "running") return;
    const next = detail.plan.find((planned) => !records[planned.id]);
    if (!next || live[next.id]) return;
    const ends = Object.values(records).map((r) => r.finished_at || 0);
    const started = Math.max(detail.updated_at || 0, ...ends);
    live[next.id] = { started, allotted_ms: 0, attempts: [], tokens: "", inferred: true };
  }

  function layout() {
    const steps = [];
    const records = detail.records || {};
    const now = Date.now() / 1000;
    inFlight(records);
    for (const planned of detail.plan) {
      const rec = records[planned.id];
      const flying = live[planned.id];
      if (rec && rec.started_at && rec.status !== "skipped") {
        steps.push({ planned, rec, start: rec.started_at, elapsed: rec.elapsed_ms, allotted: rec.allotted_ms });
      } else if (flying && !rec) {
        const elapsed = Math.max(0, (now - flying.started) * 1000);
        steps.push({ planned, flying, start: flying.started, elapsed, allotted: flying.allotted_ms });
      } else {
        steps.push({ planned, rec, start: null, elapsed: 0, allotted: rec ? rec.allotted_ms : 0 });
      }
    }
    const starts = steps.filter((s) => s.start !== null).map((s) => s.start);
    const t0 = starts.length ? Math.min(...starts) : 0;
    let elapsedEnd = 0;
    let allottedEnd = 0;
    for (const s of steps) {
      if (s.start === null) continue;
      s.offset = (s.start - t0) * 1000;
      elapsedEnd = Math.max(elapsedEnd, s.offset + s.elapsed);
      allottedEnd = Math.max(allottedEnd, s.offset + s.allotted);
    }
    // A step may be allotted the whole rest of a long budget: the axis stops at twice the
    // elapsed span and longer allotments are drawn clipped (their figure is in the label).
    const span = elapsedEnd > 0 ? Math.min(allottedEnd, 2 * elapsedEnd) || elapsedEnd : allottedEnd || 1;
    return { steps, span: Math.max(span, elapsedEnd, 1), t0 };
  }

  // A group's lanes: one per parallel branch, switch branch or map item, each with a bar per
  // inner step that has a record (inner steps are recorded under their path: gather.kb.search,
  // per_item[3].classify), on the run's shared axis. Nested groups' steps sit in their lane.
  const GROUPS = new Set(["parallel", "map", "switch"]);
  const MAX_LANES = 50;

  function laneOf(groupId, path) {
    const rest = path.slice(groupId.length);
    const item = /^\[(\d+)\]\./.exec(rest);
    if (item) return { key: `${groupId}[${item[1]}]`, name: `item ${item[1]}`, order: Number(item[1]) };
    const branch = /^\.([^.]+)\./.exec(rest);
    return branch ? { key: `${groupId}.${branch[1]}`, name: branch[1], order: null } : null;
  }

  function groupLanes(groupId, span, t0) {
    const lanes = new Map();
    for (const [path, rec] of Object.entries(detail.records || {})) {
      if (!path.startsWith(groupId) || path.includes("#")) continue;
      const lane = laneOf(groupId, path);
      if (!lane) continue;
      if (!lanes.has(lane.key)) lanes.set(lane.key, { ...lane, recs: [] });
      lanes.get(lane.key).recs.push([path, rec]);
    }
    if (!lanes.size) return null;
    const ordered = [...lanes.values()].sort((a, b) =>
      a.order !== null && b.order !== null ? a.order - b.order : 0,
    );
    const rows = ordered.slice(0, MAX_LANES).map((lane) => {
      const track = el("div", { class: "track lane-track" });
      for (const [path, rec] of lane.recs) {
        if (!rec.started_at) continue;
        const offset = (rec.started_at - t0) * 1000;
        track.append(
          el("div", {
            class: `bar-elapsed s-${rec.status}`,
            "data-path": path,
            "data-status": rec.status,
            title: `${path} ${rec.status} ${ms(rec.elapsed_ms)}${rec.error ? `: ${rec.error}` : ""}`,
            style: { left: pct(offset, span), width: pct(Math.min(rec.elapsed_ms, span - offset), span) },
          }),
        );
      }
      const statuses = lane.recs.map(([, rec]) => rec.status);
      const worst = ["failed", "timed_out", "rejected", "partial", "cancelled", "running"].find((x) =>
        statuses.includes(x),
      );
      return el(
        "li",
        { class: "lane", "data-lane": lane.key, "data-status": worst || "completed" },
        el("span", { class: "lane-name", text: lane.name, title: lane.key }),
        track,
      );
    });
    if (ordered.length > MAX_LANES) {
      rows.push(el("li", { class: "lane small", text: `${ordered.length - MAX_LANES} more lanes not drawn` }));
    }
    return el("ul", { class: "lanes", "data-group": groupId }, ...rows);
  }

  function pct(value, span) {
    return `${Math.max(0, Math.min(100, (value / span) * 100)).toFixed(3)}%`;
  }

  // Tokens the attempts' servers reported (summed), or null when none did.
  function usageOf(attempts) {
    let known = false;
    const sum = { prompt_tokens: 0, completion_tokens: 0, cached_tokens: null, total_tokens: 0, cost: null };
    for (const a of attempts || []) {
      const u = a.usage;
      if (!u) continue;
      known = true;
      sum.prompt_tokens += u.prompt_tokens || 0;
      sum.completion_tokens += u.completion_tokens || 0;
      sum.total_tokens += u.total_tokens || 0;
      if (u.cached_tokens !== null && u.cached_tokens !== undefined) sum.cached_tokens = (sum.cached_tokens || 0) + u.cached_tokens;
      if (u.cost !== null && u.cost !== undefined) sum.cost = (sum.cost || 0) + u.cost;
    }
    return known ? sum : null;
  }

  function tokensText(u) {
    const cached = u.cached_tokens !== null ? `, cached ${u.cached_tokens}` : "";
    const cost = u.cost !== null ? ` · cost ${Number(u.cost.toPrecision(6))}` : "";
    return `${u.total_tokens} tokens (prompt ${u.prompt_tokens}, completion ${u.completion_tokens}${cached})${cost}`;
  }

  function attemptChips(attempts) {
    const list = el("ul", { class: "attempts" });
    let primary = null;
    let previous = null;
    for (const a of attempts) {
      const model = a.model || "";
      if (primary === null) primary = model;
      const marks = [];
      if (previous !== null && model === previous) marks.push("retry");
      if (model && primary && model !== primary) marks.push("fallback");
      previous = model;
      const ok = a.status === "ok" || a.status === "completed";
      const elapsed = a.elapsed_ms !== undefined ? a.elapsed_ms : a.ms;
      list.append(
        el(
          "li",
          { class: `attempt ${ok ? "ok" : "bad"} ${marks.join(" ")}`, "data-marks": marks.join(" ") },
          el("b", { text: `#${a.attempt}` }),
          ...marks.map((m) => el("span", { class: `mark ${m}`, text: m })),
          el("span", { text: ` ${model}${a.endpoint ? ` @ ${a.endpoint}` : ""} · ${a.status} · ${ms(elapsed)}` }),
          a.usage ? el("span", { class: "usage", text: ` · ${a.usage.total_tokens} tok` }) : null,
          a.detail || a.why ? el("span", { class: "why", text: ` (${a.detail || a.why})` }) : null,
        ),
      );
    }
    return list;
  }

  function stepRow(s, span, t0) {
    const rec = s.rec;
    const status = rec ? rec.status : s.flying ? "running" : "pending";
    const waits = rec && rec.waits_ms ? Object.entries(rec.waits_ms) : [];
    const waited = waits.reduce((sum, [, v]) => sum + v, 0);
    const track = el("div", { class: "track" });
    if (s.start !== null) {
      track.append(
        el("div", {
          class: `bar-allotted${s.offset + s.allotted > span ? " clipped" : ""}`,
          style: { left: pct(s.offset, span), width: pct(Math.min(s.allotted, span - s.offset), span) },
        }),
        el("div", {
          class: `bar-elapsed s-${status}`,
          "data-elapsed-ms": s.elapsed.toFixed(3),
          style: { left: pct(s.offset, span), width: pct(Math.min(s.elapsed, span - s.offset), span) },
        }),
      );
      if (waited > 0) {
        track.append(
          el("div", {
            class: "bar-wait",
            title: `waited ${ms(waited)} for ${waits.map(([k]) => k).join(", ")}`,
            style: { left: pct(s.offset, span), width: pct(Math.min(waited, span - s.offset), span) },
          }),
        );
      }
    }
    const figures = [`${ms(s.elapsed)} of ${ms(s.allotted)}`];
    if (waited > 0) figures.push(`waited ${ms(waited)} (${waits.map(([k, v]) => `${k} ${ms(v)}`).join(", ")})`);
    if (rec && rec.fallback) figures.push(`answered by fallback ${rec.fallback}`);
    const attempts = rec ? rec.attempt_log : s.flying ? s.flying.attempts : [];
    const used = usageOf(attempts);
    if (used) figures.push(tokensText(used));
    const body = el(
      "div",
      { class: "step-body" },
      el("p", { class: "figures", text: figures.join(" · ") }),
      attempts && attempts.length ? attemptChips(attempts) : null,
      rec && rec.error ? el("div", { class: "error" }, valueBlock(rec.error)) : null,
      rec && rec.output !== null && rec.output !== undefined
        ? el("div", { class: "output" }, el("span", { class: "small", text: "output" }), valueBlock(rec.output))
        : null,
      s.flying && s.flying.tokens ? el("pre", { class: "tokens", text: s.flying.tokens }) : null,
    );
    const lanes = GROUPS.has(s.planned.kind) ? groupLanes(s.planned.id, span, t0) : null;
    return el(
      "li",
      { class: `step s-${status}${s.planned.optional ? " optional" : ""}`, "data-step": s.planned.id, "data-status": status },
      el(
        "div",
        { class: "label" },
        el("span", { class: "step-id", text: s.planned.id }),
        el("span", { class: "kind", text: `${s.planned.kind}${s.planned.optional ? ", optional" : ""}` }),
        statusBadge(status),
      ),
      track,
      lanes,
      body,
    );
  }

  function render() {
    $("run-id").textContent = detail.run_id;
    document.title = `chainrt run ${detail.run_id}`;
    $("chain").textContent = detail.chain;
    $("status").replaceWith(Object.assign(statusBadge(detail.status), { id: "status" }));
    // A run answered (in part) by static answers is not a plain success.
    const answers = detail.llm_answers || {};
    $("degraded").hidden = !detail.degraded;
    $("degraded").textContent = detail.degraded ? `degraded: ${answers.static} of ${answers.steps} LLM steps static` : "degraded";
    $("budget").textContent = `${ms(detail.budget.used_ms)} used of ${ms(detail.budget.total_ms)}`;
    const runUsage = usageOf(Object.values(detail.records || {}).flatMap((r) => r.attempt_log || []));
    $("tokens-box").hidden = !runUsage;
    $("tokens").textContent = runUsage ? tokensText(runUsage) : "";
    const trace = $("trace");
    trace.replaceChildren();
    if (detail.trace && detail.trace.url) {
      trace.append(el("a", { href: detail.trace.url, rel: "noopener", target: "_blank", text: "trace" }));
    } else if (detail.trace && detail.trace.trace_id) {
      trace.append(el("span", { text: `trace ${detail.trace.trace_id}` }));
    }
    $("resume-box").hidden = !RESUMABLE.has(detail.status);
    $("cancel").hidden = !["queued", "running", "waiting"].includes(detail.status);
    renderSignal();
    const { steps, span, t0 } = layout();
    $("axis").replaceChildren(
      el("span", { text: "0" }),
      el("span", { text: ms(span / 2) }),
      el("span", { text: ms(span) }),
    );
    $("waterfall").replaceChildren(...steps.map((s) => stepRow(s, span, t0)));
    $("input").replaceChildren(valueBlock(detail.input));
    $("output").replaceChildren(valueBlock(detail.output));
    $("error-box").hidden = !detail.error;
    $("error").replaceChildren(detail.error ? valueBlock(detail.error) : "");
  }

  // The signal form of a parked run: the signal's name, where it waits, and a payload of the
  // right shape to start from (filled once, so what a person typed is not overwritten).
  function renderSignal() {
    const waiting = detail.status === "waiting" ? detail.waiting_for : null;
    $("signal-box").hidden = !waiting;
    if (!waiting) return;
    $("signal-name").textContent = waiting.signal;
    $("signal-step").textContent = waiting.step;
    $("signal-until").textContent = waiting.until
      ? ` (until ${new Date(waiting.until * 1000).toLocaleString()}, then ${waiting.on_timeout})`
      : "";
    const box = $("signal-payload");
    if (box.dataset.for !== waiting.signal) {
      box.dataset.for = waiting.signal;
      box.value = JSON.stringify(waiting.example, null, 2);
    }
  }

  async function sendSignal(event) {
    event.preventDefault();
    const waiting = detail && detail.waiting_for;
    if (!waiting) return;
    let payload;
    try {
      payload = JSON.parse($("signal-payload").value);
    } catch (error) {
      setMessage(`The payload is not JSON: ${error.message}`);
      return;
    }
    try {
      const { body } = await api(`/v1/runs/${encodeURIComponent(runId)}/signal`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ name: waiting.signal, payload }),
      });
      setMessage(`Signal ${waiting.signal} sent: ${body.queued ? "the run continues" : "kept"}`);
      // The run is queued for a runner: follow it once it has left the wait.
      for (let i = 0; i < 600; i += 1) {
        const now = await refresh();
        if (!now || !["waiting", "queued"].includes(now.status)) break;
        await new Promise((done) => setTimeout(done, 100));
      }
      listen();
    } catch (error) {
      setMessage(`Signal refused: ${error.message}`);
    }
  }

  async function refresh() {
    try {
      const { body } = await api(`/v1/runs/${encodeURIComponent(runId)}/record`);
      detail = body;
      for (const id of Object.keys(body.records || {})) delete live[id];
      render();
      return body;
    } catch (error) {
      setMessage(error.status === 404 ? `No run ${runId}.` : `Cannot read the run: ${error.message}`);
      return null;
    }
  }

  function listen() {
    if (source) source.close();
    document.body.dataset.stream = "open";
    source = new EventSource(`/v1/runs/${encodeURIComponent(runId)}/events`);
    const on = (type, handler) =>
      source.addEventListener(type, (message) => {
        let event;
        try {
          event = JSON.parse(message.data);
        } catch (_) {
          return;
        }
        handler(event);
      });
    on("step_started", (e) => {
      if (detail && detail.records && detail.records[e.step_id]) return; // history: drawn
      for (const id of Object.keys(live)) if (live[id].inferred) delete live[id];
      live[e.step_id] = { started: e.ts, allotted_ms: e.allotted_ms || 0, attempts: [], tokens: "" };
      if (detail) {
        detail.status = "running";
        render();
      }
    });
    on("attempt", (e) => {
      const step = live[e.step_id];
      if (step) {
        step.attempts.push(e);
        // A failed attempt: the tokens shown were its own; the next attempt starts over.
        if (e.status !== "ok") step.tokens = "";
        render();
      }
    });
    on("token", (e) => {
      const step = live[e.step_id];
      if (step) {
        step.tokens += e.text || "";
        render();
      }
    });
    on("step_finished", () => refresh());
    on("run_finished", () => {
      source.close();
      source = null;
      // data-stream tells a reader (and the browser tests) that nothing will redraw the page.
      refresh().then(() => (document.body.dataset.stream = "ended"));
    });
    source.onerror = () => {
      // The stream ends after run_finished; otherwise the browser reconnects by itself.
      if (detail && FINAL.has(detail.status) && source) {
        source.close();
        source = null;
      }
    };
  }

  async function act(what) {
    const verb = what === "cancel" ? "Cancel" : "Resume";
    const budget = $("resume-budget").value.trim();
    const more = what === "resume" && budget ? ` with ${budget} more` : "";
    if (!window.confirm(`${verb} run ${runId}${more}?`)) return;
    try {
      const { body } = await api(`/v1/runs/${encodeURIComponent(runId)}/${what}`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(what === "resume" && budget ? { budget } : {}),
      });
      setMessage(`${verb}: ${body.status}`);
      await refresh();
      if (what === "resume") listen();
    } catch (error) {
      setMessage(`${verb} refused: ${error.message}`);
    }
  }

  $("cancel").addEventListener("click", () => act("cancel"));
  $("resume").addEventListener("click", () => act("resume"));
  $("signal-box").addEventListener("submit", sendSignal);
  refresh().then((body) => {
    if (!body) return;
    listen();
    ticker = setInterval(() => {
      if (Object.keys(live).length) render(); // running bars grow
    }, 250);
  });
  window.addEventListener("pagehide", () => {
    if (source) source.close();
    clearInterval(ticker);
  });
})();
