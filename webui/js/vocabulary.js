// The master's words and choices (GET /api/v1/webui/vocabulary): its states, which actions each experiment
// state allows, and how a trial run can end. Asked once per session, before any page is drawn, so the pages
// re-type none of them.
import { api } from "./api.js";

let words = null;
let asked = null;

export async function loadVocabulary() {
  if (!asked)
    asked = api("/webui/vocabulary").then(
      (w) => {
        words = w;
        return w;
      },
      (e) => {
        asked = null;
        throw e;
      },
    );
  return asked;
}

const loaded = () => {
  if (!words) throw new Error("the vocabulary is not loaded yet");
  return words;
};

export const experimentStates = () => loaded().experimentStates;
export const trialStates = () => loaded().trialStates;

// Whether a task is live (not ended), and whether its state allows `action` (kill).
export const taskLive = (state) => loaded().liveTaskStates.includes(state);
export const taskAllows = (state, action) => (loaded().taskActions[state] || []).includes(action);

// The actions an experiment in `state` allows (pause, activate, cancel, kill, archive).
export function experimentActions(state) {
  return new Set(loaded().experimentActions[String(state || "").replace(/^STATE_/, "")] || []);
}

// How a run ended, in the master's words; a reason it does not know, as it is.
export function ended(reason) {
  return loaded().terminationReasons[reason] || reason.toLowerCase().replace(/_/g, " ");
}
