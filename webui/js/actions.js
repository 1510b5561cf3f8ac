// The experiment actions (the same routes the CLI uses), offered as the master's state table allows them
// (the vocabulary's experimentActions): a button the state does not allow is shown disabled.
import { api } from "./api.js";
import { h } from "./dom.js";
import { experimentActions } from "./vocabulary.js";

const CONFIRM = {
  cancel: "Cancel this experiment? Its trials checkpoint and stop.",
  kill: "Kill this experiment? Its trials' Slurm jobs are cancelled at once.",
};

export function actionButtons(exp, canModify, onDone, onError) {
  const ok = experimentActions(exp.state);
  if (exp.archived) ok.add("unarchive"); // an archived experiment unarchives in any state
  const title = canModify ? undefined : "only the owner or an admin can do this";
  const button = (action, label, cls = "") =>
    h(
      "button",
      {
        class: `small ${cls}`,
        "data-action": action,
        disabled: !canModify || !ok.has(action),
        title,
        onclick: async (ev) => {
          ev.stopPropagation();
          if (CONFIRM[action] && !confirm(CONFIRM[action])) return;
          ev.target.disabled = true;
          try {
            await api(`/experiments/${exp.id}/${action}`, { method: "POST" });
            onDone(action);
          } catch (e) {
            onError(e);
          }
        },
      },
      label,
    );
  return h(
    "span",
    { class: "actions" },
    ok.has("activate") ? button("activate", "Activate") : button("pause", "Pause"),
    button("cancel", "Cancel"),
    button("kill", "Kill", "danger"),
    exp.archived ? button("unarchive", "Unarchive") : button("archive", "Archive"),
  );
}
