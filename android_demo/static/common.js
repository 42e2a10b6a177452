// What both pages share (index.html's app.js, text.html's text.js import it): the JSON API of
// android_demo/server.py, the message line, and a burst of training as the page starts, follows and reports it.

export const $ = (id) => document.getElementById(id);

export const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

export const plural = (n, noun) => `${n} ${noun}${n === 1 ? "" : "s"}`;

export const pct = (v) => (v === null || v === undefined ? "-" : `${(100 * v).toFixed(1)}%`);

// GET path, or POST body as JSON -> the answer's JSON; an answer that is not 2xx throws an Error with the server's
// message and the HTTP status (err.status)
export async function api(path, body) {
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

// the #message line: text, in red when it tells of an error
export function say(text, isError) {
  const m = $("message");
  m.textContent = text || "";
  m.classList.toggle("error", !!isError);
}

export function showVersion(version) {
  $("version").textContent = `model version ${version}`;
  $("version").dataset.version = String(version);
}

// a burst's result that ran (steps taken, validated) -> its words: kept, or rolled back and why; `how` says what
// validation measured before and after
export function verdict(r, how) {
  const took = `${plural(r.steps, "step")} in ${r.seconds.toFixed(1)} s`;
  if (r.kept) return { text: `Kept as version ${r.model_version}: ${how} (${took}).`, kind: "kept" };
  const why = r.reason.replace(/; rolled back to the previous version$/, "");
  return { text: `Rolled back, version ${r.model_version} stays: ${why} (${took}).`, kind: "rolled-back" };
}

// A burst of training as a page runs it: #personalize starts one (POST /api/personalize) or, when one runs
// already (409: another tab started it), follows that one; GET /api/progress is polled every `page.pause` ms into
// #progress-bar and page.progress(p) until it ends, #personalize disabled meanwhile; its verdict goes to #result
// (page.describe(result) -> {text, kind}, page.data(result): #result's data- attributes), then page.after() runs.
// state.polling: a page follows one burst at a time. -> { personalize, resume }
export function bursts(state, page) {
  function showResult(p) {
    const el = $("result");
    el.classList.remove("kept", "rolled-back", "error");
    if (p.error) {
      el.textContent = `The burst failed: ${p.error}`;
      el.classList.add("error");
      el.dataset.kept = "";
      return;
    }
    const d = page.describe(p.result);
    el.textContent = d.text;
    el.dataset.kept = String(p.result.kept);
    Object.assign(el.dataset, page.data(p.result));
    if (d.kind !== "none") el.classList.add(d.kind);
  }

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
        page.progress(p);
        if (!p.running) {
          if (p.result || p.error) showResult(p);
          break;
        }
        await sleep(page.pause);
      }
    } catch (e) {
      $("result").textContent = `lost track of the burst: ${e.message}`;
    } finally {
      state.polling = false;
      $("personalize").disabled = false;
    }
    await page.after();
  }

  async function personalize() {
    $("result").textContent = "";
    $("result").dataset.kept = "";
    try {
      await api("/api/personalize", {});
    } catch (e) {
      if (e.status !== 409) { // 409: one runs already (another tab started it): follow that one
        showResult({ error: e.message });
        return;
      }
    }
    await follow();
  }

  // a burst already running when the page opens (started by a command or another tab) is followed too
  function resume() {
    api("/api/progress").then((p) => { if (p.running) follow(); }).catch(() => {});
  }

  $("personalize").addEventListener("click", personalize);
  return { personalize, resume };
}
