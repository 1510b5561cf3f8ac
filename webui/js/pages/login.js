import { api } from "../api.js";
import { h } from "../dom.js";
import { pageLife } from "../page.js";

export function render(root, _params, { navigate, onLogin }) {
  const error = h("p", { class: "error", role: "alert" });
  const username = h("input", {
    name: "username",
    autocomplete: "username",
    required: true,
    autofocus: true,
  });
  const password = h("input", { name: "password", type: "password", autocomplete: "current-password" });
  const submit = h("button", { class: "primary", type: "submit" }, "Log in");
  const life = pageLife(error);
  const note = h(
    "p",
    { class: "note" },
    "A personal master's users without a password log in from the CLI (it sends the owner's key), ",
    "or here through the login link the master prints when it starts. Or give yourself a password: ",
    h("code", {}, "det user change-password"),
  );
  const logIn = async (body) => {
    life.error("");
    submit.disabled = true;
    try {
      await api("/auth/login", { method: "POST", params: { cookie: "true" }, body, signal: life.signal() });
      onLogin(await api("/webui/session", { signal: life.signal() }));
      const next = new URLSearchParams(location.search).get("next");
      const local = next?.startsWith("/") && !next.startsWith("//") ? next : "/experiments";
      // A notebook or TensorBoard (the master's proxy) is not a page of this app: load it.
      if (local.startsWith("/proxy/")) location.replace(local);
      else navigate(local, { replace: true });
    } catch (e) {
      // A 429's message says how long to wait (the seconds of its Retry-After).
      life.fail(e);
    } finally {
      submit.disabled = false;
    }
  };
  const form = h(
    "form",
    {
      onsubmit: (ev) => {
        ev.preventDefault();
        logIn({ username: username.value, password: password.value });
      },
    },
    h("h1", {}, "Log in to hpc-det"),
    h("label", {}, "User", username),
    h("label", {}, "Password", password),
    submit,
    error,
    note,
  );
  root.append(h("div", { class: "login panel" }, form));
  // A master that checks passwords against the site's directory says so: the site's password works here.
  api("/master", { signal: life.signal() })
    .then((info) => {
      if (!info.loginMethods?.includes("ldap")) return;
      note.replaceChildren(
        "Log in with your cluster account's user name and password (the site's directory). ",
        "On a login node, ",
        h("code", {}, "det user login"),
        " needs no password.",
      );
      note.dataset.login = "ldap";
    })
    .catch(() => {}); // the default note stays
  // A personal master's login link (/login#key=…, printed by det-master at start): its owner's key logs in as
  // `determined`, as the CLI does. The key leaves the address bar and the history at once.
  const key = new URLSearchParams(location.hash.slice(1)).get("key");
  if (key) {
    history.replaceState(history.state, "", location.pathname + location.search);
    logIn({ username: "determined", password: "", ownerKey: key });
  }
  return () => life.close();
}
