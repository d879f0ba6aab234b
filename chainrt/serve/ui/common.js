// chainrt dashboard: helpers shared by the pages. Every value from a run is written with
// textContent (never parsed as HTML), so an input holding "<script>" shows as text.
"use strict";

const FOLD_AT = 200; // characters: longer values are folded into a <details>

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = String(value);
    else if (key === "style") Object.assign(node.style, value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function api(path, options) {
  const response = await fetch(path, options);
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    body = null;
  }
  if (response.status === 401) {
    // This server needs an API token: log in, then come back here.
    const here = window.location.pathname + window.location.search;
    window.location.assign(`/ui/login?next=${encodeURIComponent(here)}`);
  }
  if (!response.ok) {
    const message = body && body.error ? body.error.message : response.statusText;
    const error = new Error(message || `HTTP ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return { body, headers: response.headers };
}

// Always milliseconds (grouped: "12,400 ms"), so that figures side by side never mix units.
function ms(value) {
  if (value === null || value === undefined) return "";
  return `${Math.round(value).toLocaleString("en-US")} ms`;
}

function when(seconds) {
  if (!seconds) return "";
  return new Date(seconds * 1000).toLocaleString();
}

function statusBadge(status) {
  return el("span", { class: `status s-${status}`, text: status });
}

// A JSON value as text; long ones folded (summary shows the start).
function valueBlock(value) {
  const text = typeof value === "string" ? value : JSON.stringify(value, null, 2);
  if (text === undefined) return el("pre", { class: "value", text: "null" });
  if (text.length <= FOLD_AT) return el("pre", { class: "value", text });
  return el(
    "details",
    { class: "fold" },
    el("summary", { text: `${text.slice(0, 80)}… (${text.length} characters)` }),
    el("pre", { class: "value", text }),
  );
}

window.chainrt = { el, api, ms, when, statusBadge, valueBlock };
