// The experiment actions (the same routes the CLI uses); which ones a state allows, as the master does.
import { api } from "./api.js";
import { h, stateName } from "./dom.js";

const TERMINAL = new Set(["COMPLETED", "CANCELED", "ERROR", "DELETED"]);

export function allowed(exp) {
  const s = stateName(exp.state);
  const terminal = TERMINAL.has(s);
  return {
    pause: s === "ACTIVE",
    activate: s === "PAUSED",
    cancel: !terminal && !s.startsWith("STOPPING"),
    kill: !terminal && s !== "STOPPING_KILLED",
    archive: terminal && !exp.archived,
    unarchive: terminal && exp.archived,
  };
}

const CONFIRM = {
  cancel: "Cancel this experiment? Its trials checkpoint and stop.",
  kill: "Kill this experiment? Its trials' Slurm jobs are cancelled at once.",
};

export function actionButtons(exp, canModify, onDone, onError) {
  const ok = allowed(exp);
  const title = canModify ? undefined : "only the owner or an admin can do this";
  const button = (action, label, cls = "") => h("button", {
    class: `small ${cls}`, "data-action": action, disabled: !canModify || !ok[action], title,
    onclick: async (ev) => {
      ev.stopPropagation();
      if (CONFIRM[action] && !confirm(CONFIRM[action])) return;
      ev.target.disabled = true;
      try { await api(`/experiments/${exp.id}/${action}`, { method: "POST" }); onDone(action); } catch (e) { onError(e); }
    },
  }, label);
  return h("span", { class: "actions" },
    ok.activate ? button("activate", "Activate") : button("pause", "Pause"),
    button("cancel", "Cancel"), button("kill", "Kill", "danger"),
    exp.archived ? button("unarchive", "Unarchive") : button("archive", "Archive"));
}
