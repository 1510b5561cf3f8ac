// The config tab: the experiment's config as submitted.
import { h, replace } from "../../dom.js";

export function config(page) {
  const e = page.data().experiment;
  replace(
    page.body,
    h("pre", { class: "config", id: "config" }, e.originalConfig || JSON.stringify(e.config, null, 2)),
  );
}
