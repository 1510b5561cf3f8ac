// The tasks page: your commands, notebooks, TensorBoards and shells (an admin's: everyone's), with where
// each runs, an Open link to a notebook or TensorBoard that answers (through the master's /proxy/), and Kill.
import { api } from "../api.js";
import { h, replace, stateBadge, stateName, time } from "../dom.js";
import { pageLife, runningDuration } from "../page.js";

const KINDS = [["commands", "command", "Command"], ["notebooks", "notebook", "Notebook"],
  ["tensorboards", "tensorboard", "TensorBoard"], ["shells", "shell", "Shell"]];
const REFRESH_MS = 3000;
const START = {
  Command: "det cmd run CMD", Notebook: "det notebook start", TensorBoard: "det tensorboard start EXP_ID", Shell: "det shell start",
};

export function render(root) {
  const error = h("p", { class: "error", id: "tasks-error" });
  const note = h("span", { class: "muted" });
  const ended = h("input", { type: "checkbox", onchange: () => load() });
  const table = h("div", { id: "tasks" });
  root.append(h("div", { class: "header" }, h("h1", {}, "Tasks"), note),
    h("div", { class: "toolbar" }, h("label", {}, ended, "show ended")), error, table);
  const life = pageLife(error);
  let timer = null;

  async function load() {
    life.cancel(timer);
    try {
      const lists = await Promise.all(KINDS.map(([plural, , label]) =>
        api(`/${plural}`, { signal: life.signal() }).then((d) => d[plural].map((t) => ({ ...t, kind: label, plural })))));
      const all = lists.flat().sort((a, b) => (b.startTime || "").localeCompare(a.startTime || ""));
      const shown = ended.checked ? all : all.filter((t) => stateName(t.state) !== "TERMINATED");
      note.textContent = `${shown.length} of ${all.length} task${all.length === 1 ? "" : "s"}`;
      error.textContent = "";
      replace(table, draw(shown));
    } catch (e) { life.fail(e); }
    timer = life.later(load, REFRESH_MS);
  }

  async function kill(t, button) {
    button.disabled = true;
    try { await api(`/${t.plural}/${t.id}/kill`, { method: "POST" }); await load(); } catch (e) { life.fail(e); button.disabled = false; }
  }

  function draw(rows) {
    if (!rows.length) {
      return h("p", { class: "muted" }, "No tasks. Start one from a login node: ",
        Object.values(START).map((c, i) => [i ? ", " : "", h("code", {}, c)]), ".");
    }
    const head = h("tr", {}, ["Type", "Description", "Owner", "State", "Slurm job", "Node", "Started", "Duration", "Exit", ""].map((x) => h("th", {}, x)));
    const body = rows.map((t) => {
      const live = stateName(t.state) !== "TERMINATED";
      const open = t.isReady && t.serviceAddress
        ? h("a", { href: t.serviceAddress, target: "_blank", rel: "noopener", class: "button small", "data-open": t.id }, "Open")
        : "";
      const killButton = live && stateName(t.state) !== "TERMINATING"
        ? h("button", { class: "small danger", "data-kill": t.id, onclick: (e) => kill(t, e.target) }, "Kill") : "";
      const waiting = t.pendingReason ? h("div", { class: "muted" }, `waiting: ${t.pendingReason}`) : "";
      return h("tr", { "data-task": t.id },
        h("td", {}, t.kind),
        h("td", { title: t.id }, t.description, h("div", { class: "muted mono" }, t.id.slice(0, 8))),
        h("td", {}, t.username),
        h("td", {}, stateBadge(t.state), waiting),
        h("td", {}, t.slurmJobId || ""),
        h("td", {}, t.nodeList || ""),
        h("td", {}, time(t.startTime)),
        h("td", {}, runningDuration(t.startTime, t.endTime)),
        h("td", { title: t.exitStatus || "" }, t.exitCode ?? "", t.exitStatus && !live ? h("div", { class: "muted" }, t.exitStatus) : ""),
        h("td", {}, open, " ", killButton));
    });
    return h("div", { class: "table-wrap" }, h("table", {}, h("thead", {}, head), h("tbody", {}, body)));
  }

  load();
  life.clock(root);
  return () => life.close();
}
