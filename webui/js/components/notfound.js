// What a page shows for an id (or tab) that names nothing.
import { h, link } from "../dom.js";

export function notFound(root, what, id) {
  root.append(
    h(
      "div",
      { class: "notfound" },
      h("h1", {}, `No ${what} ${id}`),
      h(
        "p",
        {},
        `There is no ${what} with id ${JSON.stringify(String(id))}: it may have been deleted, or the link is wrong.`,
      ),
      h("p", {}, link("/experiments", "Go to the experiments")),
    ),
  );
}
