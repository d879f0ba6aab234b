// chainrt dashboard: the fleet page. This runner's supervised loops, the queued runs that no
// live runner serves (GET /v1/fleet) and the dead letters (GET /v1/dlq, the admin scope), each
// with Retry and Drop. Every value is written as text.
"use strict";

(() => {
  const { el, api, when } = window.chainrt;
  const message = document.getElementById("message");

  function fill(id, rows) {
    const body = document.querySelector(`#${id} tbody`);
    body.replaceChildren(...rows);
  }

  async function act(letter, what) {
    if (!window.confirm(`${what} dead letter ${letter.id} (run ${letter.run_id})?`)) return;
    try {
      await api(`/v1/dlq/${encodeURIComponent(letter.id)}/${what}`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: "{}",
      });
      message.textContent = `${what}: ${letter.id}`;
    } catch (error) {
      message.textContent = `${what} refused: ${error.message}`;
    }
    await refresh();
  }

  async function refresh() {
    try {
      const { body: fleet } = await api("/v1/fleet");
      fill("loops", Object.entries(fleet.loops).map(([name, loop]) =>
        el("tr", {}, el("td", { text: name }), el("td", { text: loop.up ? "up" : "down" }),
          el("td", { text: loop.restarts }), el("td", { text: loop.error || "" }))));
      fill("unserved", fleet.unserved.length
        ? fleet.unserved.map((u) => el("tr", {}, el("td", { text: u.chain }), el("td", { text: u.waiting })))
        : [el("tr", {}, el("td", { colspan: 2, text: "none" }))]);
    } catch (error) {
      message.textContent = `fleet: ${error.message}`;
    }
    try {
      const { body: letters } = await api("/v1/dlq");
      fill("dead", letters.length
        ? letters.map((d) => el("tr", {},
          el("td", { text: d.id }),
          el("td", {}, d.run_id ? el("a", { href: `/ui/runs/${encodeURIComponent(d.run_id)}`, text: d.run_id }) : "-"),
          el("td", { text: d.chain || "-" }), el("td", { text: d.deliveries }),
          el("td", { text: d.reason }), el("td", { text: when(d.dead_at) }),
          el("td", {},
            el("button", { type: "button", class: "retry", text: "Retry" }),
            el("button", { type: "button", class: "drop", text: "Drop" }))))
        : [el("tr", {}, el("td", { colspan: 7, text: "no dead letters" }))]);
      letters.forEach((letter, i) => {
        const row = document.querySelectorAll("#dead tbody tr")[i];
        row.querySelector(".retry").addEventListener("click", () => act(letter, "retry"));
        row.querySelector(".drop").addEventListener("click", () => act(letter, "drop"));
      });
    } catch (error) {
      message.textContent = `dead letters: ${error.message}`;
    }
  }

  refresh();
  setInterval(refresh, 5000);
})();
