// The one table: columns [{ key, label, value(row), render(row), num, wrap, sortable, ascFirst, title(row) }].
// With `view` ({ sort, asc }) its headers sort: on the client (rows sorted here) or, with `server: true`, by
// the caller, who fetches the rows in that order; `onSort({ sort, asc })` is told either way. A cell shows
// `render(row)` or else `num(value(row))`; `value` defaults to `row[key]`. `rowAttrs(row)` gives each row's
// attributes (data-* for tests and links), `empty` what to show when there are no rows.
import { h, num } from "../dom.js";

const cellValue = (c) => c.value || ((r) => r[c.key]);

function sorted(columns, rows, view) {
  const col = columns.find((c) => c.key === view.sort) || columns[0];
  const value = cellValue(col);
  return [...rows].sort((a, b) => {
    const x = value(a),
      y = value(b);
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * (view.asc ? 1 : -1);
  });
}

export function table(columns, rows, { view, onSort, server = false, id, rowAttrs, empty } = {}) {
  if (!rows.length && empty !== undefined) return empty;
  const sorts = (c) => view && c.sortable !== false;
  const head = h(
    "tr",
    {},
    columns.map((c) =>
      h(
        "th",
        {
          class: [
            sorts(c) ? "sortable" : "",
            view && c.key === view.sort ? "sorted" : "",
            view?.asc ? "asc" : "",
            c.num ? "num" : "",
          ]
            .filter(Boolean)
            .join(" "),
          onclick: sorts(c)
            ? () =>
                onSort(
                  c.key === view.sort ? { sort: c.key, asc: !view.asc } : { sort: c.key, asc: !!c.ascFirst },
                )
            : undefined,
        },
        c.label,
      ),
    ),
  );
  const shown = view && !server ? sorted(columns, rows, view) : rows;
  const body = shown.map((r) =>
    h(
      "tr",
      rowAttrs ? rowAttrs(r) : {},
      columns.map((c) =>
        h(
          "td",
          {
            class: [c.num ? "num" : "", c.wrap ? "wrap" : ""].filter(Boolean).join(" ") || undefined,
            title: c.title ? c.title(r) : undefined,
          },
          c.render ? c.render(r) : num(cellValue(c)(r)),
        ),
      ),
    ),
  );
  return h("div", { class: "table-wrap" }, h("table", { id }, h("thead", {}, head), h("tbody", {}, body)));
}
