// The tasks page: your commands, notebooks, TensorBoards and shells (an admin's: everyone's), with where
// each runs, an Open link to a notebook or TensorBoard that answers (through the master's /proxy/), and Kill.
import { api } from "../api.js";
import { table } from "../components/table.js";
import { h, replace, stateBadge, time, waitingBadge } from "../dom.js";
import { pageLife, runningDuration } from "../page.js";
import { taskAllows, taskLive } from "../vocabulary.js";

const KINDS = [
  ["commands", "Command"],
  ["notebooks", "Notebook"],
  ["tensorboards", "TensorBoard"],
  ["shells", "Shell"],
];
const REFRESH_MS = 3000;
const START = ["det cmd run CMD", "det notebook start", "det tensorboard start EXP_ID", "det shell start"];

export function render(root) {
  const error = h("p", { class: "error", id: "tasks-error" });
  const note = h("span", { class: "muted" });
  const ended = h("input", { type: "checkbox", onchange: () => poll.now() });
  const box = h("div", { id: "tasks" });
  root.append(
    h("div", { class: "header" }, h("h1", {}, "Tasks"), note),
    h("div", { class: "toolbar" }, h("label", {}, ended, "show ended")),
    error,
    box,
  );
  const life = pageLife(error);

  async function load() {
    const lists = await Promise.all(
      KINDS.map(([plural, label]) =>
        api(`/${plural}`, { signal: life.signal() }).then((d) =>
          d[plural].map((t) => ({ ...t, kind: label, plural })),
        ),
      ),
    );
    const all = lists.flat().sort((a, b) => (b.startTime || "").localeCompare(a.startTime || ""));
    const shown = ended.checked ? all : all.filter((t) => taskLive(t.state));
    note.textContent = `${shown.length} of ${all.length} task${all.length === 1 ? "" : "s"}`;
    error.textContent = "";
    replace(
      box,
      table(COLUMNS, shown, {
        rowAttrs: (t) => ({ "data-task": t.id }),
        empty: h(
          "p",
          { class: "muted" },
          "No tasks. Start one from a login node: ",
          START.map((c, i) => [i ? ", " : "", h("code", {}, c)]),
          ".",
        ),
      }),
    );
  }

  async function kill(t, button) {
    button.disabled = true;
    try {
      await api(`/${t.plural}/${t.id}/kill`, { method: "POST" });
      poll.now();
    } catch (e) {
      life.fail(e);
      button.disabled = false;
    }
  }

  const COLUMNS = [
    { key: "kind", label: "Type", render: (t) => t.kind },
    {
      key: "description",
      label: "Description",
      title: (t) => t.id,
      render: (t) => [t.description, h("div", { class: "muted mono" }, t.id.slice(0, 8))],
    },
    { key: "owner", label: "Owner", render: (t) => t.username },
    {
      key: "state",
      label: "State",
      render: (t) => [stateBadge(t.state), t.pendingReason ? h("div", {}, waitingBadge(t)) : ""],
    },
    { key: "job", label: "Slurm job", render: (t) => t.slurmJobId || "" },
    { key: "node", label: "Node", render: (t) => t.nodeList || "" },
    { key: "started", label: "Started", render: (t) => time(t.startTime) },
    { key: "duration", label: "Duration", render: (t) => runningDuration(t.startTime, t.endTime) },
    {
      key: "exit",
      label: "Exit",
      title: (t) => t.exitStatus || "",
      render: (t) => [
        t.exitCode ?? "",
        t.exitStatus && !taskLive(t.state) ? h("div", { class: "muted" }, t.exitStatus) : "",
      ],
    },
    {
      key: "open",
      label: "",
      render: (t) => [
        t.isReady && t.serviceAddress
          ? h(
              "a",
              {
                href: t.serviceAddress,
                target: "_blank",
                rel: "noopener",
                class: "button small",
                "data-open": t.id,
              },
              "Open",
            )
          : "",
        " ",
        taskAllows(t.state, "kill")
          ? h(
              "button",
              { class: "small danger", "data-kill": t.id, onclick: (e) => kill(t, e.target) },
              "Kill",
            )
          : "",
      ],
    },
  ];

  const poll = life.every(load, REFRESH_MS);
  life.clock(root);
  return () => life.close();
}
