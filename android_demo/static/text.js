// The text home's page: type -> three next-word suggestions (POST /api/suggest), tap one to insert it; Enter or
// "send" stores the sentence (POST /api/send) and, if asked, starts a burst (POST /api/personalize) whose result it
// shows. Everything goes through the JSON API of android_demo/server.py; nothing is fetched from anywhere else.
"use strict";

const state = { asked: 0, shown: 0, suggestions: [], polling: false, sent: 0 };
window.edgetrain = state; // a test (or a curious person) can read what the page did

const $ = (id) => document.getElementById(id);
const box = $("text");

async function api(path, body) {
  const opts = body === undefined ? {} : {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  };
  const r = await fetch(path, opts);
  let data = null;
  try {
    data = await r.json();
  } catch (e) {
    data = { error: `${r.status} ${r.statusText}` };
  }
  if (!r.ok) {
    const err = new Error((data && data.error) || `${r.status} ${r.statusText}`);
    err.status = r.status;
    throw err;
  }
  return data;
}

function say(text, isError) {
  const m = $("message");
  m.textContent = text || "";
  m.classList.toggle("error", !!isError);
}

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
    say(`stored as ${r.ids.length} sample${r.ids.length === 1 ? "" : "s"}`);
    showCount(r.samples);
    suggest();
    if ($("auto").checked) await personalize();
  } catch (e) {
    say(e.message, true);
  }
}

const pct = (v) => (v === null || v === undefined ? "-" : `${(100 * v).toFixed(1)}%`);

function describe(r) {
  if (!r.steps) return { text: `No burst: ${r.reason}.`, kind: "none" };
  const how = `next-word top-1 on held-out sentences ${pct(r.val_accuracy_before)} → ${pct(r.val_accuracy_after)}`;
  const took = `${r.steps} step${r.steps === 1 ? "" : "s"} in ${r.seconds.toFixed(1)} s`;
  if (r.kept) return { text: `Kept as version ${r.model_version}: ${how} (${took}).`, kind: "kept" };
  const why = r.reason.replace(/; rolled back to the previous version$/, "");
  return { text: `Rolled back, version ${r.model_version} stays: ${why} (${took}).`, kind: "rolled-back" };
}

function showResult(p) {
  const el = $("result");
  el.classList.remove("kept", "rolled-back", "error");
  if (p.error) {
    el.textContent = `The burst failed: ${p.error}`;
    el.classList.add("error");
    el.dataset.kept = "";
    return;
  }
  const d = describe(p.result);
  el.textContent = d.text;
  el.dataset.kept = String(p.result.kept);
  el.dataset.steps = String(p.result.steps);
  el.dataset.before = String(p.result.val_accuracy_before);
  el.dataset.after = String(p.result.val_accuracy_after);
  if (d.kind !== "none") el.classList.add(d.kind);
}

const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

async function follow() {
  if (state.polling) return;
  state.polling = true;
  $("personalize").disabled = true;
  try {
    for (;;) {
      const p = await api("/api/progress");
      const bar = $("progress-bar");
      bar.max = Math.max(1, p.of);
      bar.value = p.step;
      $("progress").textContent = p.running ? `training: step ${p.step} of at most ${p.of}` : "done";
      if (!p.running) {
        if (p.result || p.error) showResult(p);
        break;
      }
      await sleep(250);
    }
  } catch (e) {
    $("result").textContent = `lost track of the burst: ${e.message}`;
  } finally {
    state.polling = false;
    $("personalize").disabled = false;
  }
  await refreshStatus();
  suggest(); // the words, read again by the model as it is now
}

async function personalize() {
  $("result").textContent = "";
  $("result").dataset.kept = "";
  try {
    await api("/api/personalize", {});
  } catch (e) {
    if (e.status !== 409) { // 409: one runs already: follow that one
      showResult({ error: e.message });
      return;
    }
  }
  await follow();
}

function showCount(n) {
  $("samples").textContent = `${n} sentence${n === 1 ? "" : "s"}`;
  $("samples").dataset.count = String(n);
}

async function refreshStatus() {
  try {
    const st = await api("/api/status");
    $("version").textContent = `model version ${st.model_version}`;
    $("version").dataset.version = String(st.model_version);
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
$("personalize").addEventListener("click", personalize);

refreshStatus();
suggest();
api("/api/progress").then((p) => { if (p.running) follow(); }).catch(() => {});
