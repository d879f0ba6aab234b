// chainrt dashboard: the runs list. Newest first, filters by status and chain, exact run id
// search (with the filters), keyset pages ("Older runs" asks for the runs before the last one
// shown), and live: the stream GET /v1/events/runs (EventSource) tells each run created or
// changing status, and the rows are updated in place (filters applied here). Its "reload"
// event (a new stream, or a reconnect that cannot catch up) reads the list again. Only if the
// stream cannot be opened is the first page read again every 2 s instead.
"use strict";
(function () {
  const { el, api, ms, when, statusBadge } = window.chainrt;
  const asked = Number(new URLSearchParams(location.search).get("limit"));
  const PAGE = Number.isInteger(asked) && asked >= 1 && asked <= 1000 ? asked : 50; // ?limit=
  const REFRESH_MS = 2000;
  const body = document.querySelector("#runs tbody");
  const message = document.getElementById("message");
  const older = document.getElementById("older");
  const live = document.getElementById("live");
  const form = document.getElementById("filters");
  const fields = {
    status: document.getElementById("status"),
    chain: document.getElementById("chain"),
    search: document.getElementById("search"),
  };
  let cursor = null; // the API's cursor for the page after the rows shown
  let extraPages = 0; // pages added with "Older runs": live refresh stops then
  let generation = 0; // a newer query wins over an answer still in flight
  let loading = 0; // list reads in flight: stream events wait for them (a read may be older)
  let waiting = []; // stream events heard while a read was in flight
  let polling = null; // the 2 s timer, only when the stream cannot be used

  function row(run) {
    const used = `${ms(run.budget.used_ms)} / ${ms(run.budget.total_ms)}`;
    const link = el("a", { href: `/ui/runs/${encodeURIComponent(run.run_id)}`, text: run.run_id });
    return el(
      "tr",
      {
        "data-run-id": run.run_id,
        "data-status": run.status,
        "data-created": run.created_at,
        "data-updated": run.updated_at,
      },
      el("td", { class: "id" }, link),
      el("td", { text: run.chain }),
      el("td", {}, statusBadge(run.status)),
      el("td", { text: used }),
      el("td", { text: when(run.created_at) }),
      // Why it waits (no live runner serves its chain) or why it failed: text, never HTML.
      el("td", { class: "reason", text: run.reason || "", title: run.reason || null }),
    );
  }

  function query(before) {
    const params = new URLSearchParams({ limit: String(PAGE) });
    if (fields.status.value) params.set("status", fields.status.value);
    if (fields.chain.value) params.set("chain", fields.chain.value);
    const runId = fields.search.value.trim();
    if (runId) params.set("run_id", runId);
    if (before) params.set("cursor", before);
    return `/v1/runs?${params}`;
  }

  function syncUrl() {
    const params = new URLSearchParams();
    if (PAGE !== 50) params.set("limit", String(PAGE));
    if (fields.status.value) params.set("status", fields.status.value);
    if (fields.chain.value) params.set("chain", fields.chain.value);
    if (fields.search.value.trim()) params.set("run_id", fields.search.value.trim());
    const search = params.toString();
    history.replaceState(null, "", search ? `?${search}` : location.pathname);
  }

  function showCount() {
    const runId = fields.search.value.trim();
    message.textContent = body.children.length ? "" : runId ? `No run ${runId}.` : "No runs.";
  }

  function matches(run) {
    const runId = fields.search.value.trim();
    return (
      (!fields.status.value || run.status === fields.status.value) &&
      (!fields.chain.value || run.chain === fields.chain.value) &&
      (!runId || run.run_id === runId)
    );
  }

  // Newest first, as the API orders: created_at, then run id, both descending.
  function before(run, tr) {
    const created = Number(tr.dataset.created);
    return run.created_at > created || (run.created_at === created && run.run_id > tr.dataset.runId);
  }

  // One run from the stream: its row updated, added where it sorts, or removed when it left
  // the filter. A run older than the last row shown is left to "Older runs" while there are more.
  function apply(run) {
    if (loading) {
      waiting.push(run);
      return;
    }
    const existing = Array.from(body.children).find((tr) => tr.dataset.runId === run.run_id);
    if (existing && Number(existing.dataset.updated) > run.updated_at) return; // older news
    if (!matches(run)) {
      if (existing) existing.remove();
    } else if (existing) {
      // A stream row carries the record's error only: a queued run keeps the reason it was
      // read with (no live runner serves its chain) while it stays queued.
      const kept = existing.querySelector("td.reason");
      if (!run.reason && run.status === "queued" && existing.dataset.status === "queued" && kept) {
        run = { ...run, reason: kept.textContent };
      }
      existing.replaceWith(row(run));
    } else {
      const next = Array.from(body.children).find((tr) => before(run, tr));
      if (next) body.insertBefore(row(run), next);
      else if (!cursor) body.append(row(run));
    }
    showCount();
  }

  async function load(append) {
    const mine = ++generation;
    loading += 1;
    try {
      const { body: runs, headers } = await api(query(append ? cursor : null));
      if (mine !== generation) return;
      const rows = runs.map(row);
      if (append) body.append(...rows);
      else body.replaceChildren(...rows);
      cursor = headers.get("X-Next-Cursor");
      older.hidden = !cursor;
      showCount();
    } catch (error) {
      if (mine === generation) message.textContent = `Cannot read runs: ${error.message}`;
    } finally {
      loading -= 1;
      if (!loading) {
        const heard = waiting;
        waiting = [];
        heard.forEach(apply);
      }
    }
  }

  function poll() {
    if (polling) return;
    live.textContent = "live: refreshed every 2 s";
    document.body.dataset.live = "polling";
    load(false);
    polling = setInterval(() => {
      if (extraPages === 0 && document.visibilityState === "visible") load(false);
    }, REFRESH_MS);
  }

  // The stream; polling only when EventSource is missing or the stream never opens.
  function listen() {
    if (!window.EventSource) return poll();
    const source = new EventSource("/v1/events/runs");
    let opened = false;
    let failures = 0;
    source.addEventListener("reload", async () => {
      opened = true;
      extraPages = 0;
      await load(false);
      live.textContent = "live";
      document.body.dataset.live = "stream";
    });
    source.addEventListener("run", (message) => {
      let run;
      try {
        run = JSON.parse(message.data);
      } catch (_) {
        return; // not a JSON event: skipped
      }
      apply(run);
    });
    source.onopen = () => {
      failures = 0;
      if (opened) live.textContent = "live";
    };
    source.onerror = () => {
      failures += 1;
      if (source.readyState === EventSource.CLOSED || (!opened && failures >= 3)) {
        source.close();
        poll();
      } else {
        live.textContent = "live: reconnecting…";
      }
    };
  }

  async function loadChains() {
    try {
      const { body: chains } = await api("/v1/chains");
      for (const chain of chains) fields.chain.append(el("option", { value: chain.name, text: chain.name }));
    } catch (error) {
      message.textContent = `Cannot read chains: ${error.message}`;
    }
  }

  function restart() {
    extraPages = 0;
    syncUrl();
    load(false);
  }

  const params = new URLSearchParams(location.search);
  fields.status.value = params.get("status") || "";
  fields.search.value = params.get("run_id") || "";
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    restart();
  });
  fields.status.addEventListener("change", restart);
  fields.chain.addEventListener("change", restart);
  fields.search.addEventListener("input", restart);
  older.addEventListener("click", () => {
    extraPages += 1;
    load(true);
  });
  loadChains().then(() => {
    fields.chain.value = params.get("chain") || "";
    listen(); // its first event ("reload") reads the list
  });
})();
