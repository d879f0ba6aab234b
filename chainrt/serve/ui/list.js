// chainrt dashboard: the runs list. Newest first, filters by status and chain, exact run id
// search (with the filters), keyset pages ("Older runs" asks for the runs before the last one shown), and live:
// the first page is read again every 2 s (the API has no stream of the list).
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

  function row(run) {
    const used = `${ms(run.budget.used_ms)} / ${ms(run.budget.total_ms)}`;
    const link = el("a", { href: `/ui/runs/${encodeURIComponent(run.run_id)}`, text: run.run_id });
    return el(
      "tr",
      { "data-run-id": run.run_id, "data-status": run.status },
      el("td", { class: "id" }, link),
      el("td", { text: run.chain }),
      el("td", {}, statusBadge(run.status)),
      el("td", { text: used }),
      el("td", { text: when(run.created_at) }),
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

  async function load(append) {
    const mine = ++generation;
    try {
      const { body: runs, headers } = await api(query(append ? cursor : null));
      if (mine !== generation) return;
      const rows = runs.map(row);
      if (append) body.append(...rows);
      else body.replaceChildren(...rows);
      cursor = headers.get("X-Next-Cursor");
      older.hidden = !cursor;
      const runId = fields.search.value.trim();
      message.textContent = body.children.length ? "" : runId ? `No run ${runId}.` : "No runs.";
    } catch (error) {
      if (mine === generation) message.textContent = `Cannot read runs: ${error.message}`;
    }
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
    load(false);
  });
  live.textContent = "live: refreshed every 2 s";
  setInterval(() => {
    if (extraPages === 0 && document.visibilityState === "visible") load(false);
  }, REFRESH_MS);
})();
