// chainrt dashboard: log in with an API token. The server answers with an HttpOnly,
// SameSite=Strict cookie holding it; this script never stores the token itself.
"use strict";

(function () {
  const form = document.getElementById("login");
  const message = document.getElementById("message");

  // Back to the page that sent us here: only a dashboard path (never another site).
  function nextPage() {
    const next = new URLSearchParams(window.location.search).get("next") || "";
    return /^\/ui\/[^/\\]/.test(next) || next === "/ui/" ? next : "/ui/";
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    message.textContent = "";
    const token = document.getElementById("token").value.trim();
    try {
      const response = await fetch("/ui/login", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ token }),
      });
      let body = null;
      try {
        body = await response.json();
      } catch (_) {
        body = null;
      }
      if (!response.ok) {
        message.textContent = body && body.error ? body.error.message : `HTTP ${response.status}`;
        return;
      }
      window.location.assign(nextPage());
    } catch (error) {
      message.textContent = `cannot log in: ${error.message}`;
    }
  });
})();
