// The search tab: ASHA's brackets and rungs, each trial's metric at the rung (best first, as the searcher
// ranks them), paused and resumed trials, and the trials still training to each rung.
import { api } from "../../api.js";
import { table } from "../../components/table.js";
import { h, link, num, replace } from "../../dom.js";

const RUNG = [
  {
    key: "trial",
    label: "Trial",
    render: (t) => (t.trialId ? link(`/trials/${t.trialId}`, `#${t.trialId}`) : t.requestId.slice(0, 8)),
  },
  { key: "metric", label: "Metric", num: true, render: (t) => (t.training ? "…" : num(t.metric)) },
  { key: "status", label: "Status", render: status },
];

function status(t) {
  if (t.training) return h("span", { class: "state running" }, "training to this rung");
  const words = t.status === "paused" ? "paused · waiting for promotion" : t.status;
  return [
    h("span", { class: `state ${t.status}` }, words),
    t.resumed ? h("span", { class: "muted" }, " resumed") : "",
  ];
}

function rung(r) {
  const rows = [...r.trials, ...r.trainingTrialIds.map((trialId) => ({ trialId, training: true }))];
  return h(
    "div",
    { class: "panel rung", "data-rung": r.index },
    h(
      "h3",
      {},
      `Rung ${r.index + 1}`,
      r.length ? h("span", { class: "muted" }, ` · trains to ${num(r.length)}`) : "",
      h("span", { class: "muted" }, ` · ${r.trials.length} reported`),
    ),
    table(RUNG, rows, { empty: h("p", { class: "muted" }, "no results yet") }),
  );
}

export function search(page) {
  const box = h("div", { id: "rungs" });
  replace(page.body, box);
  // Rungs change with the searcher's snapshot (the experiment's row) and with the trials' states.
  page.live.on(["experiment", "trialStates"], async () => {
    const data = await api(`/webui/experiments/${page.id}/rungs`, { signal: page.signal() });
    if (!data.brackets.length) {
      const why =
        data.searcherType && !/asha|halving/.test(data.searcherType) ? " (only ASHA searches do)" : " yet";
      replace(
        box,
        h("p", { class: "muted" }, `The ${data.searcherType || "search"} method has no rungs to show${why}.`),
      );
      return;
    }
    const paused = data.brackets.flatMap((b) =>
      b.rungs.flatMap((r) => r.trials.filter((t) => t.status === "paused")),
    ).length;
    replace(
      box,
      h(
        "p",
        { class: "muted" },
        `Promotion: ${data.promotion}. `,
        data.promotion === "pause"
          ? `A trial not promoted at once is paused: its Slurm job checkpoints and ends, freeing the GPUs, and it resumes from that checkpoint if later results promote it. ${paused} paused now, waiting for promotion.`
          : "A trial not promoted at once stops for good.",
      ),
      data.brackets.map((b) =>
        h(
          "div",
          {},
          data.brackets.length > 1 ? h("h2", {}, `Bracket ${b.index + 1}`) : "",
          h("div", { class: "rungs" }, b.rungs.map(rung)),
        ),
      ),
    );
  });
}
