// What the detail pages share: their requests and timers (all ended when the page is left), their error
// line, and their live updates. A page opens one change stream (/api/v1/webui/.../changes: which of its
// tables changed, as digests) and each table fetches again only when a digest it depends on changed. If the
// stream breaks, the page reconnects with backoff and meanwhile refreshes every table on a timer.
import { ApiError, stream } from "./api.js";
import { duration, h } from "./dom.js";

const FALLBACK_MS = 2000; // how often tables refresh while the stream is down
const BACKOFF_MS = [500, 1000, 2000, 4000, 8000, 15000];
const STALL_MS = 40000; // no byte for this long (the server sends a heartbeat every 15 s): reconnect

// A page's life: `aborts` (every controller in it is aborted when the page ends; `signal()` is the page's
// own), `later(fn, ms)` (a timer cleared then; `cancel(timer)` clears it before), the error line (`error`,
// `fail`), and `close()`, which the page's cleanup calls. A page whose error line has left the document
// (another page replaced it without calling its cleanup) ends at its next `closed()` check.
export function pageLife(errorLine) {
  const page = new AbortController();
  const timers = new Set();
  let closed = false;
  let shown = false;
  const life = {
    aborts: [page],
    signal: () => page.signal,
    closed() {
      if (!closed && errorLine.isConnected) shown = true;
      else if (!closed && shown) life.close();
      return closed;
    },
    error(message) {
      errorLine.textContent = message || "";
    },
    fail(e) {
      if (!life.closed() && e && e.name !== "AbortError") life.error(e.message);
    },
    later(fn, ms) {
      const t = setTimeout(() => {
        timers.delete(t);
        if (!life.closed()) fn();
      }, ms);
      timers.add(t);
      return t;
    },
    cancel(t) {
      clearTimeout(t);
      timers.delete(t);
    },
    sleep(ms) {
      return new Promise((resolve) => life.later(resolve, ms));
    },
    // A page without a change stream: `load()` now and again `ms` after each run ends; `now()` runs it at
    // once (after an action, a new filter), never two at a time. A failed run shows on the error line.
    every(load, ms) {
      let timer = null;
      let running = false;
      let again = false;
      const run = async () => {
        if (running) {
          again = true;
          return;
        }
        life.cancel(timer);
        running = true;
        try {
          await load();
        } catch (e) {
          life.fail(e);
        } finally {
          running = false;
        }
        if (life.closed()) return;
        if (again) {
          again = false;
          run();
        } else timer = life.later(run, ms);
      };
      run();
      return { now: run };
    },
    // Durations of things still running tick every second (a DOM update, no request).
    clock(root) {
      const tick = () => {
        for (const el of root.querySelectorAll("[data-running-since]"))
          el.textContent = duration(el.dataset.runningSince, null);
        life.later(tick, 1000);
      };
      life.later(tick, 1000);
    },
    close() {
      closed = true;
      for (const t of timers) clearTimeout(t);
      timers.clear();
      for (const c of life.aborts) c.abort();
    },
  };
  return life;
}

// A duration that the page's clock keeps current while `end` is unset.
export function runningDuration(start, end) {
  return h("span", { "data-running-since": !end && start ? start : undefined }, duration(start, end));
}

// The page's change stream at `path`. `on(keys, load, options)` registers a table: `load()` fetches and
// draws it; it runs when a digest of one of `keys` differs from the digests its last fetch is known to
// include (those seen before that fetch began), never twice at once, and at most once per `minIntervalMs`
// or per `spacing` times its last fetch's duration (a table slow to build is fetched less often).
// `eager`: fetch at once instead of waiting for the stream's first message (a header: the page needs it to
// draw anything, and learns from it that the thing does not exist). `refresh(table)` fetches now (after an
// action, new filters), whatever `minIntervalMs` says. A 404 from the stream (no such thing) ends it. While
// the browser tab is hidden the stream is closed (a browser has 6 connections per server for all its tabs)
// and nothing refreshes; when it is shown again the stream reopens and what changed meanwhile is fetched.
export function liveUpdates(life, path) {
  const digests = {};
  const tables = [];
  let mode = "connecting"; // then "live" (a message came), "offline" (refreshing on a timer) or "gone"
  let polling = false;
  let current = null; // the open stream's controller
  let wake = null; // ends the wait for the tab to be shown

  const hidden = () => document.visibilityState === "hidden";
  const stale = (t) =>
    !t.loaded || t.keys.some((k) => digests[k] !== undefined && digests[k] !== t.covered[k]);

  async function run(t, now = false) {
    if (life.closed()) return;
    if (now) t.now = true;
    if (t.running) {
      t.again = true;
      return;
    }
    const wait = t.now
      ? 0
      : t.lastStart + Math.max(t.minIntervalMs, t.spacing * t.lastTook) - performance.now();
    if (wait > 0) {
      if (!t.timer)
        t.timer = life.later(() => {
          t.timer = null;
          if (mode !== "live" || stale(t)) run(t);
        }, wait);
      return;
    }
    t.running = true;
    t.again = false;
    t.now = false;
    t.lastStart = performance.now();
    const covering = Object.fromEntries(t.keys.map((k) => [k, digests[k]]));
    try {
      await t.load();
      t.covered = covering;
      t.loaded = true;
      t.lastTook = performance.now() - t.lastStart;
    } catch (e) {
      life.fail(e);
      // A failed fetch is tried again (not a refusal: that would be refused again).
      if (mode === "live" && !(e instanceof ApiError && e.status < 500))
        life.later(() => run(t), FALLBACK_MS);
    } finally {
      t.running = false;
    }
    if (t.again || (mode === "live" && stale(t))) run(t);
  }

  async function poll() {
    if (polling) return;
    polling = true;
    while (mode === "offline" && !hidden() && !life.closed()) {
      for (const t of tables) run(t);
      await life.sleep(FALLBACK_MS);
    }
    polling = false;
  }

  async function connect() {
    let attempt = 0;
    while (!life.closed()) {
      if (hidden()) {
        await new Promise((resolve) => {
          wake = resolve;
        });
        wake = null;
        attempt = 0;
        continue;
      }
      const controller = new AbortController();
      current = controller;
      life.aborts.push(controller);
      let watchdog = null;
      const alive = () => {
        life.cancel(watchdog);
        watchdog = life.later(() => controller.abort(), STALL_MS);
      };
      try {
        alive();
        await stream(path, {
          signal: controller.signal,
          onData: alive,
          onMessage: (m) => {
            if (life.closed()) return;
            Object.assign(digests, m);
            mode = "live";
            attempt = 0;
            for (const t of tables) if (stale(t)) run(t);
          },
        });
      } catch (e) {
        if (life.closed()) return;
        if (e instanceof ApiError && e.status === 401) return; // the router goes to the login page
        if (e instanceof ApiError && e.status === 404) {
          mode = "gone";
          return;
        }
      } finally {
        life.cancel(watchdog);
        life.aborts.splice(life.aborts.indexOf(controller), 1);
        current = null;
      }
      if (hidden()) continue;
      mode = "offline";
      poll();
      await life.sleep(BACKOFF_MS[Math.min(attempt, BACKOFF_MS.length - 1)]);
      attempt += 1;
    }
  }

  const onVisibility = () => {
    if (hidden()) {
      if (current) current.abort();
    } else if (wake) wake();
  };
  document.addEventListener("visibilitychange", onVisibility);
  life.aborts.push({
    abort: () => {
      document.removeEventListener("visibilitychange", onVisibility);
      if (wake) wake();
    },
  });
  connect();

  return {
    on(keys, load, { minIntervalMs = 0, spacing = 0, eager = false } = {}) {
      const t = {
        keys,
        load,
        minIntervalMs,
        spacing,
        covered: {},
        loaded: false,
        running: false,
        again: false,
        now: false,
        lastStart: -Infinity,
        lastTook: 0,
        timer: null,
      };
      tables.push(t);
      if (eager || mode !== "connecting") run(t);
      return t;
    },
    refresh(t) {
      if (t) run(t, true);
    },
  };
}
