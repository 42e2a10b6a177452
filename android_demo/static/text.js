// The text home's page: type -> three next-word suggestions (POST /api/suggest), tap one to insert it; Enter or
// "send" stores the sentence (POST /api/send) and, if asked, starts a burst (POST /api/personalize) whose result it
// shows. Everything goes through the JSON API of android_demo/server.py; nothing is fetched from anywhere else.
import { $, api, bursts, pct, plural, say, showVersion, verdict } from "./common.js";

const state = { asked: 0, shown: 0, suggestions: [], polling: false, sent: 0 };
window.edgetrain = state; // a test (or a curious person) can read what the page did

const box = $("text");

// ---- suggestions ----------------------------------------------------------------------------------------------
// the words before the one being typed: the model suggests the word at the cursor's word
const context = (text) => text.slice(0, text.search(/\S*$/));

function showSuggestions(words) {
  const row = $("suggestions");
  row.replaceChildren();
  words.forEach((w, i) => {
    const b = document.createElement("button");
    b.type = "button";
    b.id = `suggestion-${i}`;
    b.className = "suggestion";
    b.dataset.word = w;
    b.textContent = w;
    b.addEventListener("click", () => insert(w));
    row.append(b);
  });
  state.suggestions = words;
}

let timer = null;
async function suggest() {
  const n = ++state.asked;
  try {
    const r = await api("/api/suggest", { text: context(box.value) });
    if (n < state.shown) return; // an older answer after a newer one
    state.shown = n;
    showSuggestions(r.words);
  } catch (e) {
    say(`no suggestions: ${e.message}`, true);
  }
}
const later = () => { clearTimeout(timer); timer = setTimeout(suggest, 120); };

function insert(word) {
  box.value = `${context(box.value)}${word} `;
  box.focus();
  suggest();
}

// ---- sending and bursts ---------------------------------------------------------------------------------------
async function send() {
  const text = box.value.trim();
  if (!text) return;
  try {
    const r = await api("/api/send", { text });
    const li = document.createElement("li");
    li.textContent = text;
    $("sent").prepend(li);
    state.sent += 1;
    box.value = "";
    say(`stored as ${plural(r.ids.length, "sample")}`);
    showCount(r.samples);
    suggest();
    if ($("auto").checked) await burst.personalize();
  } catch (e) {
    say(e.message, true);
  }
}

function describe(r) {
  if (!r.steps) return { text: `No burst: ${r.reason}.`, kind: "none" };
  const how = `next-word top-1 on held-out sentences ${pct(r.val_accuracy_before)} → ${pct(r.val_accuracy_after)}`;
  return verdict(r, how);
}

const burst = bursts(state, {
  progress: (p) => {
    $("progress").textContent = p.running ? `training: step ${p.step} of at most ${p.of}` : "done";
  },
  pause: 250,
  describe,
  data: (r) => ({
    steps: String(r.steps),
    before: String(r.val_accuracy_before),
    after: String(r.val_accuracy_after),
  }),
  after: async () => {
    await refreshStatus();
    suggest(); // the words, read again by the model as it is now
  },
});

function showCount(n) {
  $("samples").textContent = plural(n, "sentence");
  $("samples").dataset.count = String(n);
}

async function refreshStatus() {
  try {
    const st = await api("/api/status");
    showVersion(st.model_version);
    showCount(st.samples);
  } catch (e) {
    say(`cannot reach the app: ${e.message}`, true);
  }
}

box.addEventListener("input", later);
box.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    send();
  }
});
$("send").addEventListener("click", send);

refreshStatus();
suggest();
burst.resume();
