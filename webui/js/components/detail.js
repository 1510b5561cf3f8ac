// The detail-page shell (an experiment, a trial): the id checked, a header fetched first and again whenever
// its change-stream keys change, the tabs (each a module: `view(page)` draws into `page.body`), and "not
// found" for an id or a tab that names nothing. `spec`:
//   what       "experiment", "trial": the words of "not found"
//   base       the page's path, without the tab
//   tabs       [{ key, label, view }], the first the default
//   changes    the page's change stream (see page.js liveUpdates)
//   headerKeys which digests of that stream the header depends on
//   load(signal)          fetches the header's data (a 404 the first time: not found)
//   header(box, data, page) draws it
// A tab gets `page`: { id, body, live, navigate, session, aborts, signal, error, fail, data(), onHeader(fn),
// refreshHeader() }; `onHeader(fn)` runs fn after each header fetch (a tab drawn from the header's data).
import { ApiError } from "../api.js";
import { h, replace } from "../dom.js";
import { liveUpdates, pageLife } from "../page.js";
import { notFound } from "./notfound.js";

export function detailPage(root, { id, tab }, ctx, spec) {
  if (!/^[1-9][0-9]{0,9}$/.test(id)) {
    notFound(root, spec.what, id);
    return null;
  }
  const open = tab ? spec.tabs.find((t) => t.key === tab) : spec.tabs[0];
  if (!open) {
    notFound(root, "tab", tab);
    return null;
  }
  const headerBox = h("div");
  const error = h("p", { class: "error" });
  const body = h("div", { id: "tab-body" });
  const life = pageLife(error);
  const live = liveUpdates(life, spec.changes);
  const onHeader = [];
  let data = null;
  const page = {
    id,
    body,
    live,
    navigate: ctx.navigate,
    session: ctx.session,
    aborts: life.aborts,
    signal: life.signal,
    error: life.error,
    fail: life.fail,
    data: () => data,
    onHeader: (fn) => onHeader.push(fn),
    refreshHeader: () => live.refresh(header),
  };

  async function loadHeader() {
    let fresh;
    try {
      fresh = await spec.load(life.signal());
    } catch (e) {
      if (e instanceof ApiError && e.status === 404 && !data) {
        life.close();
        replace(root);
        notFound(root, spec.what, id);
        return;
      }
      throw e;
    }
    if (life.closed()) return;
    const first = data === null;
    data = fresh;
    spec.header(headerBox, data, page);
    error.textContent = "";
    if (first) open.view(page);
    for (const fn of onHeader) fn();
  }

  const tabs = h(
    "nav",
    { class: "tabs" },
    spec.tabs.map((t) =>
      h(
        "a",
        {
          href: `${spec.base}/${t.key}`,
          "data-nav": "",
          class: t === open ? "active" : "",
          "data-tab": t.key,
        },
        t.label,
      ),
    ),
  );
  root.append(headerBox, error, tabs, body);
  const header = live.on(spec.headerKeys, loadHeader, { eager: true });
  life.clock(root);
  return () => life.close();
}

// One fact of a header: a label over its value.
export function fact(label, value, id) {
  return h("div", {}, h("span", {}, label), h("span", { id }, value));
}
