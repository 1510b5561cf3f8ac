// The logs tab: the trial's logs followed live, filtered by rank and text, downloadable.
import { ApiError, stream } from "../../api.js";
import { h, replace } from "../../dom.js";

const MAX_LOG_LINES = 20000;

export function logs(page) {
  const lines = [];
  const ranks = new Set();
  const view = { rank: "", text: "", follow: true };
  const box = h("div", { class: "logs", id: "logs", tabindex: 0 });
  const rankSel = h(
    "select",
    {
      "aria-label": "rank",
      onchange: (e) => {
        view.rank = e.target.value;
        redraw();
      },
    },
    h("option", { value: "" }, "all ranks"),
  );
  const search = h("input", {
    placeholder: "search…",
    "aria-label": "search logs",
    oninput: (e) => {
      view.text = e.target.value;
      redraw();
    },
  });
  const follow = h("input", {
    type: "checkbox",
    checked: true,
    onchange: (e) => {
      view.follow = e.target.checked;
      if (view.follow) box.scrollTop = box.scrollHeight;
    },
  });
  const status = h("span", { class: "muted", id: "log-status" });
  const download = h(
    "button",
    {
      class: "small",
      onclick: () => {
        const blob = new Blob(
          lines.map((l) => l.message),
          { type: "text/plain" },
        );
        const a = h("a", { href: URL.createObjectURL(blob), download: `trial-${page.id}-logs.txt` });
        document.body.append(a);
        a.click();
        a.remove();
        setTimeout(() => URL.revokeObjectURL(a.href), 1000);
      },
    },
    "Download",
  );
  replace(
    page.body,
    h("div", { class: "toolbar" }, rankSel, search, h("label", {}, follow, "follow"), download, status),
    box,
  );

  const shown = (l) =>
    (!view.rank || String(l.rankId) === view.rank) &&
    (!view.text || l.message.toLowerCase().includes(view.text.toLowerCase()));
  function lineEl(l) {
    const el = h("div", {});
    const text = l.message.replace(/\n$/, "");
    if (view.text) {
      const i = text.toLowerCase().indexOf(view.text.toLowerCase());
      el.append(
        text.slice(0, i),
        h("mark", {}, text.slice(i, i + view.text.length)),
        text.slice(i + view.text.length),
      );
    } else el.textContent = text;
    return el;
  }
  function redraw() {
    box.replaceChildren(...lines.filter(shown).slice(-5000).map(lineEl));
    if (view.follow) box.scrollTop = box.scrollHeight;
  }
  function add(batch) {
    const frag = document.createDocumentFragment();
    for (const l of batch) {
      lines.push(l);
      if (l.rankId !== null && l.rankId !== undefined && !ranks.has(l.rankId)) {
        ranks.add(l.rankId);
        rankSel.append(h("option", { value: String(l.rankId) }, `rank ${l.rankId}`));
      }
      if (shown(l)) frag.append(lineEl(l));
    }
    if (lines.length > MAX_LOG_LINES) lines.splice(0, lines.length - MAX_LOG_LINES);
    box.append(frag);
    while (box.childElementCount > 5000) box.firstChild.remove();
    if (view.follow) box.scrollTop = box.scrollHeight;
    status.textContent = `${lines.length} lines${following ? " · following" : ""}`;
  }
  let following = true;
  let pending = [];
  let flush = null;
  status.textContent = "following…";
  stream(`/trials/${page.id}/logs`, {
    params: { follow: "true" },
    signal: page.signal(),
    onMessage: (l) => {
      pending.push(l);
      if (!flush)
        flush = setTimeout(() => {
          flush = null;
          const b = pending;
          pending = [];
          add(b);
        }, 50);
    },
  })
    .then(() => {
      following = false;
      setTimeout(() => {
        status.textContent = `${lines.length} lines · the trial has ended`;
      }, 100);
    })
    .catch((e) => {
      if (e.name === "AbortError") return;
      following = false;
      if (e instanceof ApiError && e.status === 403)
        box.replaceChildren(
          h("div", {}, "A trial's logs are visible to the experiment's owner and admins only."),
        );
      else page.error(e.message);
    });
}
