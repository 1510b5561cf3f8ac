// The runs tab: each Slurm job the trial ran as, and how it ended (in the master's words).
import { table } from "../../components/table.js";
import { h, replace, stateBadge, time } from "../../dom.js";
import { ended } from "../../vocabulary.js";

export function runs(page) {
  const box = h("div", { id: "runs" });
  replace(page.body, box);
  const view = { sort: "run", asc: true };
  const draw = () =>
    replace(
      box,
      table(
        [
          { key: "run", label: "Run", num: true, value: (r) => r.trialRunId },
          { key: "job", label: "Slurm job", value: (r) => r.slurmJobId, render: (r) => r.slurmJobId || "–" },
          { key: "nodes", label: "Nodes", value: (r) => r.nodeList, render: (r) => r.nodeList || "–" },
          { key: "state", label: "State", value: (r) => r.state, render: (r) => stateBadge(r.state) },
          {
            key: "submit",
            label: "Submitted",
            value: (r) => r.submitTime,
            render: (r) => time(r.submitTime),
          },
          { key: "start", label: "Started", value: (r) => r.startTime, render: (r) => time(r.startTime) },
          { key: "end", label: "Ended", value: (r) => r.endTime, render: (r) => time(r.endTime) },
          { key: "how", label: "How it ended", value: (r) => r.exitReason, render: endedHow },
          {
            key: "msg",
            label: "Message",
            wrap: true,
            value: (r) => r.exitMessage,
            render: (r) => r.exitMessage || "",
          },
        ],
        page.data().trial.runs || [],
        {
          view,
          onSort: (v) => {
            Object.assign(view, v);
            draw();
          },
        },
      ),
    );
  draw();
  page.onHeader(draw); // the runs come with the trial, which the header fetches again when they change
}

function endedHow(r) {
  if (r.exitReason) return ended(r.exitReason);
  return r.endTime ? "–" : h("span", { class: "muted" }, "running");
}
