// The REST API, as the browser calls it: the session cookie is sent by the browser (HttpOnly: this script
// never sees the token); every state-changing request carries the session's CSRF value, which the master
// hands over in JSON (the login answer, GET /webui/session) and this module keeps in memory: no cookie of
// the master is readable by a script.

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let csrf = "";
export function setCsrfToken(value) {
  csrf = value || "";
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v === undefined || v === null || v === "") continue;
    for (const item of Array.isArray(v) ? v : [v]) q.append(k, String(item));
  }
  const s = q.toString();
  return s ? `?${s}` : "";
}

let onUnauthenticated = () => {};
export function setUnauthenticatedHandler(fn) {
  onUnauthenticated = fn;
}

async function failure(resp) {
  let body = {};
  try {
    body = await resp.json();
  } catch {
    /* not JSON */
  }
  const message = body.message || body.detail || `${resp.status} ${resp.statusText}`;
  if (resp.status === 401) onUnauthenticated();
  return new ApiError(resp.status, body.code || "", message);
}

export async function api(path, { method = "GET", body, params, signal } = {}) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = csrf;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(`/api/v1${path}${query(params)}`, {
    method,
    headers,
    signal,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!resp.ok) throw await failure(resp);
  return resp.status === 204 ? {} : resp.json();
}

// A newline-delimited JSON stream (Determined's streaming shape: one {"result": ...} per line).
// Calls onMessage(result) for each, and onData() for every chunk read (heartbeats, blank lines, included);
// resolves when the stream ends; abort with the signal.
export async function stream(path, { params, signal, onMessage, onData }) {
  const resp = await fetch(`/api/v1${path}${query(params)}`, { signal, credentials: "same-origin" });
  if (!resp.ok) throw await failure(resp);
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    if (onData) onData();
    buffered += decoder.decode(value, { stream: true });
    for (let nl = buffered.indexOf("\n"); nl >= 0; nl = buffered.indexOf("\n")) {
      const line = buffered.slice(0, nl).trim();
      buffered = buffered.slice(nl + 1);
      if (line) onMessage(JSON.parse(line).result);
    }
  }
  if (buffered.trim()) onMessage(JSON.parse(buffered).result);
}
