// A tiny DOM builder and the formatting every page shares.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export const link = (href, ...children) => h("a", { href, "data-nav": "" }, ...children);

export function stateName(s) {
  return (s || "").replace(/^STATE_/, "");
}
export function stateBadge(s) {
  const n = stateName(s);
  return h("span", { class: `state ${n}` }, n.replace(/_/g, " "));
}

// Why a pending run or task waits: "stuck" (it will not start until someone acts: held, a partition down),
// or Slurm's reason with its class (limit, resources, priority, held, dependency, other) and the jobs ahead.
export function waitingBadge(r) {
  if (!r?.pendingReason) return null;
  if (r.stuck)
    return h("span", { class: "state stuck", title: r.pendingReason }, `stuck: ${r.pendingReason}`);
  const known = r.jobsAhead !== null && r.jobsAhead !== undefined;
  const notes = [r.pendingClass, known ? `${r.jobsAhead} ahead` : ""].filter(Boolean).join(", ");
  const title = known ? `${r.jobsAhead} pending jobs ahead in Slurm's queue` : undefined;
  return h("span", { class: "muted", title }, `waiting: ${r.pendingReason}${notes ? ` (${notes})` : ""}`);
}

export function progressBar(p) {
  if (p === null || p === undefined) return h("span", { class: "muted" }, "–");
  const pct = Math.max(0, Math.min(100, p * 100));
  return h(
    "span",
    { title: `${pct.toFixed(0)}%` },
    h("span", { class: "progress" }, h("span", { style: { width: `${pct}%` } })),
    ` ${pct.toFixed(0)}%`,
  );
}

export function num(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v) && Math.abs(v) < 1e9) return v.toLocaleString("en-US");
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(3) : Number(v.toPrecision(digits)).toString();
}

export function time(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function duration(startIso, endIso) {
  if (!startIso) return "–";
  const ms = (endIso ? new Date(endIso) : new Date()) - new Date(startIso);
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function hparamsText(hp) {
  return Object.entries(flatten(hp || {}))
    .map(([k, v]) => `${k}=${typeof v === "number" ? num(v) : v}`)
    .join(" ");
}

export function flatten(obj, prefix = "") {
  const out = {};
  for (const [k, v] of Object.entries(obj || {})) {
    const key = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v)) Object.assign(out, flatten(v, key));
    else out[key] = v;
  }
  return out;
}

export function copyable(text) {
  const btn = h(
    "button",
    {
      class: "small",
      onclick: async () => {
        try {
          await navigator.clipboard.writeText(text);
          btn.textContent = "copied";
        } catch {
          btn.textContent = "select it";
        }
        setTimeout(() => {
          btn.textContent = "copy";
        }, 1500);
      },
    },
    "copy",
  );
  return h("span", { class: "copy" }, h("code", {}, text), btn);
}
