// The router: history-API paths, one page module per route; a page's render() returns its cleanup (its
// pageLife's close: timers, requests, streams), run when the page is left. Pages import components/ and
// tabs/, never one another (tests/unit/test_webui_layout.py).
import { ApiError, api, setCsrfToken, setUnauthenticatedHandler } from "./api.js";
import { h, replace } from "./dom.js";
import * as login from "./pages/login.js";
import * as experiments from "./pages/experiments.js";
import * as experiment from "./pages/experiment.js";
import * as trial from "./pages/trial.js";
import * as cluster from "./pages/cluster.js";
import * as tasks from "./pages/tasks.js";
import { loadVocabulary } from "./vocabulary.js";

const routes = [
  [/^\/login$/, login, () => ({})],
  [/^\/(?:experiments)?$/, experiments, () => ({})],
  [/^\/experiments\/([^/]+)(?:\/([a-z-]+))?$/, experiment, (m) => ({ id: m[1], tab: m[2] })],
  [/^\/trials\/([^/]+)(?:\/([a-z-]+))?$/, trial, (m) => ({ id: m[1], tab: m[2] })],
  [/^\/cluster$/, cluster, () => ({})],
  [/^\/tasks$/, tasks, () => ({})],
];

const app = document.getElementById("app");
const top = document.getElementById("top");
let cleanup = null;
let session = null;

export function navigate(path, { replace: replaceState = false } = {}) {
  if (replaceState) history.replaceState(null, "", path);
  else history.pushState(null, "", path);
  route();
}

function toLogin() {
  session = null;
  if (location.pathname !== "/login") {
    const next = location.pathname + location.search;
    navigate(`/login${next && next !== "/" ? `?next=${encodeURIComponent(next)}` : ""}`, { replace: true });
  }
}
setUnauthenticatedHandler(toLogin);

function header() {
  if (!session) return replace(top, h("span", { class: "brand" }, "hpc-det"));
  const here = location.pathname;
  const nav = (href, label, match) =>
    h("a", { href, "data-nav": "", class: match.test(here) ? "active" : "" }, label);
  replace(
    top,
    h("a", { href: "/experiments", "data-nav": "", class: "brand" }, "hpc-det"),
    nav("/experiments", "Experiments", /^\/(experiments|trials|$)/),
    nav("/tasks", "Tasks", /^\/tasks/),
    nav("/cluster", "Cluster", /^\/cluster/),
    h("span", { class: "spacer" }),
    h("span", { id: "whoami" }, session.user.username, session.user.admin ? " (admin)" : ""),
    h("button", { class: "small", id: "logout", onclick: logout }, "Log out"),
  );
}

async function logout() {
  try {
    await api("/auth/logout", { method: "POST" });
  } catch {
    /* an expired session: nothing to end */
  }
  session = null;
  navigate("/login", { replace: true });
}

export function currentUser() {
  return session?.user;
}

let routing = 0; // which route() call is the latest: an earlier one still awaiting the session renders nothing

async function route() {
  const mine = ++routing;
  if (cleanup) {
    try {
      cleanup();
    } catch (e) {
      console.warn(e);
    }
    cleanup = null;
  }
  const path = location.pathname.replace(/\/+$/, "") || "/";
  const found = routes
    .map(([re, page, params]) => {
      const m = path.match(re);
      return m && { page, params: params(m) };
    })
    .find(Boolean);
  if (!found) {
    header();
    replace(
      app,
      h(
        "div",
        { class: "notfound" },
        h("h1", {}, "Page not found"),
        h("p", {}, `There is no page at ${path}.`),
        h("p", {}, h("a", { href: "/experiments", "data-nav": "" }, "Go to the experiments")),
      ),
    );
    return;
  }
  if (found.page !== login) {
    // Who is logged in, and the master's vocabulary (its states and actions), both before any page draws.
    try {
      [session] = await Promise.all([session || api("/webui/session"), loadVocabulary()]);
      setCsrfToken(session.csrfToken);
    } catch (e) {
      // A 401 has gone to the login page already (api.js); anything else is said here, with a way to retry.
      if (mine === routing && !(e instanceof ApiError && e.status === 401)) {
        header();
        replace(
          app,
          h(
            "div",
            { class: "notfound" },
            h("h1", {}, "The master did not answer"),
            h("p", { class: "error" }, e.message),
            h("p", {}, h("a", { href: location.pathname + location.search, "data-nav": "" }, "Try again")),
          ),
        );
      }
      return;
    }
    if (mine !== routing) return;
  }
  header();
  replace(app);
  cleanup =
    found.page.render(app, found.params, {
      session,
      navigate,
      onLogin: (s) => {
        session = s;
        setCsrfToken(s.csrfToken);
      },
    }) || null;
}

document.addEventListener("click", (ev) => {
  const a = ev.target.closest("a[data-nav]");
  if (!a || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.button !== 0) return;
  ev.preventDefault();
  navigate(a.getAttribute("href"));
});
window.addEventListener("popstate", route);
// Modules run deferred, when the document is usually parsed already: route once, now or when it is.
if (document.readyState === "loading") window.addEventListener("DOMContentLoaded", route, { once: true });
else route();
