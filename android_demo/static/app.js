// The app's page: draw a digit -> the model's input (MNIST's way) -> predict, label, personalize, chart.
// Everything goes through the JSON API of android_demo/server.py; nothing is fetched from anywhere else.
import { $, api, bursts, pct, plural, say as show, showVersion, verdict } from "./common.js";

const SIZE = 280; // the canvas's own pixels (its CSS size follows the screen)
const PEN = 24; // stroke width in canvas pixels: MNIST's strokes are about 2-3 of its 20-pixel box
const INK = 0.1; // a canvas pixel brighter than this counts for the bounding box
const N = 28; // the model's image side
const BOX = 20; // MNIST fits the digit's bounding box into 20x20, then centres it in 28x28

// state the page keeps; window.edgetrain lets a test (or a curious person) read what was sent
const state = {
  strokes: [], // [[[x, y], ...], ...] in canvas pixels
  lastPixels: null, // the last 28x28 drawing sent to the model (rows of floats in [0, 1])
  lastPrediction: null,
  pending: 0, // predictions asked for and not answered yet
  inputShape: [1, N, N],
  inputRange: [0, 1], // the raw values the model's input pipeline takes (GET /api/status): [0, 255] for 8-bit pixels
  polling: false,
};
window.edgetrain = state;

const canvas = $("canvas");
const ctx = canvas.getContext("2d", { willReadFrequently: true });

// the message line says how to teach the model when it has nothing else to say
const HOW = "tap the digit you meant: the drawing becomes one of your samples";
const say = (text, isError) => show(text || HOW, isError);

// ---- drawing ----------------------------------------------------------------------------------------------
function render() {
  ctx.fillStyle = "#000";
  ctx.fillRect(0, 0, SIZE, SIZE);
  ctx.strokeStyle = "#fff";
  ctx.fillStyle = "#fff";
  ctx.lineWidth = PEN;
  ctx.lineCap = "round";
  ctx.lineJoin = "round";
  for (const s of state.strokes) {
    if (s.length === 1) { // a tap: a dot as wide as the pen
      ctx.beginPath();
      ctx.arc(s[0][0], s[0][1], PEN / 2, 0, 2 * Math.PI);
      ctx.fill();
      continue;
    }
    ctx.beginPath();
    ctx.moveTo(s[0][0], s[0][1]);
    for (let i = 1; i < s.length; i++) ctx.lineTo(s[i][0], s[i][1]);
    ctx.stroke();
  }
}

function point(e) {
  const r = canvas.getBoundingClientRect();
  return [(e.clientX - r.left) * SIZE / r.width, (e.clientY - r.top) * SIZE / r.height];
}

let pen = null; // the pointer that draws now
canvas.addEventListener("pointerdown", (e) => {
  if (pen !== null || (e.pointerType === "mouse" && e.button !== 0)) return;
  e.preventDefault();
  pen = e.pointerId;
  canvas.setPointerCapture(e.pointerId);
  state.strokes.push([point(e)]);
  render();
});
canvas.addEventListener("pointermove", (e) => {
  if (e.pointerId !== pen) return;
  e.preventDefault();
  const stroke = state.strokes[state.strokes.length - 1];
  const events = e.getCoalescedEvents ? e.getCoalescedEvents() : [];
  for (const c of (events.length ? events : [e])) stroke.push(point(c));
  render();
});
function endStroke(e) {
  if (e.pointerId !== pen) return;
  pen = null;
  predict();
}
canvas.addEventListener("pointerup", endStroke);
canvas.addEventListener("pointercancel", endStroke);
canvas.addEventListener("contextmenu", (e) => e.preventDefault());

function clearDrawing() {
  predicting++; // an answer still on its way is for a drawing that is gone
  state.strokes = [];
  state.lastPixels = null;
  state.lastPrediction = null;
  render();
  $("prediction").textContent = "?";
  $("confidence").textContent = "no drawing yet";
  $("confidence").dataset.value = "";
  drawPreview(null);
  drawProbs(null);
}
$("clear").addEventListener("click", () => { clearDrawing(); say(""); });

// ---- the drawing as MNIST draws its digits ----------------------------------------------------------------
// weights[i][j]: the share of source pixel j in target pixel i when `from` pixels are averaged into `to`
function areaWeights(from, to) {
  const w = [];
  const step = from / to;
  for (let i = 0; i < to; i++) {
    const a = i * step, b = (i + 1) * step;
    const row = [];
    for (let j = Math.floor(a); j < Math.min(from, Math.ceil(b)); j++) {
      const overlap = Math.min(b, j + 1) - Math.max(a, j);
      if (overlap > 0) row.push([j, overlap / step]);
    }
    w.push(row);
  }
  return w;
}

// canvas -> 28x28 rows in [0, 1]: crop to the ink's bounding box, average it into a box of at most 20x20
// keeping its aspect, and put that in 28x28 so that its centre of mass sits at the centre (MNIST's recipe);
// null when nothing is drawn
function toPixels() {
  const rgba = ctx.getImageData(0, 0, SIZE, SIZE).data;
  const v = new Float64Array(SIZE * SIZE);
  let x0 = SIZE, y0 = SIZE, x1 = -1, y1 = -1;
  for (let y = 0; y < SIZE; y++) {
    for (let x = 0; x < SIZE; x++) {
      const a = rgba[4 * (y * SIZE + x)] / 255;
      v[y * SIZE + x] = a;
      if (a > INK) {
        if (x < x0) x0 = x;
        if (x > x1) x1 = x;
        if (y < y0) y0 = y;
        if (y > y1) y1 = y;
      }
    }
  }
  if (x1 < 0) return null;
  const w = x1 - x0 + 1, h = y1 - y0 + 1, side = Math.max(w, h);
  const tw = Math.max(1, Math.round(w * BOX / side)), th = Math.max(1, Math.round(h * BOX / side));
  const wx = areaWeights(w, tw), wy = areaWeights(h, th);
  // rows first (x), then columns (y): small[i][j] = sum wy[i][k] * wx[j][l] * crop[k][l]
  const tmp = [];
  for (let y = 0; y < h; y++) {
    const row = new Float64Array(tw);
    for (let j = 0; j < tw; j++) {
      let s = 0;
      for (const [l, f] of wx[j]) s += f * v[(y0 + y) * SIZE + x0 + l];
      row[j] = s;
    }
    tmp.push(row);
  }
  const small = [];
  let mass = 0, mx = 0, my = 0;
  for (let i = 0; i < th; i++) {
    const row = new Float64Array(tw);
    for (let j = 0; j < tw; j++) {
      let s = 0;
      for (const [k, f] of wy[i]) s += f * tmp[k][j];
      row[j] = s;
      mass += s;
      mx += s * (j + 0.5);
      my += s * (i + 0.5);
    }
    small.push(row);
  }
  const clamp = (o, n) => Math.min(N - n, Math.max(0, o));
  const ox = clamp(Math.round(N / 2 - mx / mass), tw), oy = clamp(Math.round(N / 2 - my / mass), th);
  const out = [];
  for (let y = 0; y < N; y++) out.push(new Array(N).fill(0));
  for (let i = 0; i < th; i++) {
    for (let j = 0; j < tw; j++) out[oy + i][ox + j] = Math.min(1, Math.max(0, small[i][j]));
  }
  return out;
}

// the request's "pixels": the 28x28 rows as the model's raw input (8-bit pixels, 0..255, when its input pipeline
// takes them; else as they are, in [0, 1]), wrapped in as many singleton axes as the model's input has
function asInput(rows) {
  const eightBit = state.inputRange[1] >= 255;
  let x = eightBit ? rows.map((row) => row.map((v) => Math.round(v * 255))) : rows;
  for (let k = state.inputShape.length - 2; k > 0; k--) x = [x];
  return x;
}

function drawPreview(rows) {
  const p = $("preview").getContext("2d");
  const img = p.createImageData(N, N);
  for (let y = 0; y < N; y++) {
    for (let x = 0; x < N; x++) {
      const g = rows ? Math.round(rows[y][x] * 255) : 0;
      const i = 4 * (y * N + x);
      img.data[i] = img.data[i + 1] = img.data[i + 2] = g;
      img.data[i + 3] = 255;
    }
  }
  p.putImageData(img, 0, 0);
}

function drawProbs(probs) {
  const box = $("probs");
  box.textContent = "";
  if (!probs) return;
  const top = probs.indexOf(Math.max(...probs));
  probs.forEach((p, k) => {
    const d = document.createElement("div");
    if (k === top) d.className = "top";
    const bar = document.createElement("i");
    bar.style.height = `${Math.max(1, Math.round(p * 46))}px`;
    d.append(bar, String(k));
    box.append(d);
  });
}

let predicting = 0; // only the newest request's answer is shown
async function predict() {
  const rows = toPixels();
  state.lastPixels = rows;
  drawPreview(rows);
  if (!rows) return;
  const ticket = ++predicting;
  state.pending++;
  try {
    const r = await api("/api/predict", { pixels: asInput(rows) });
    if (ticket !== predicting) return;
    state.lastPrediction = r;
    $("prediction").textContent = String(r.prediction);
    $("confidence").textContent = `${(100 * r.confidence).toFixed(1)}% sure (model version ${r.version})`;
    $("confidence").dataset.value = String(r.confidence);
    drawProbs(r.probabilities);
  } catch (e) {
    say(`could not predict: ${e.message}`, true);
  } finally {
    state.pending--;
  }
}

// ---- samples ----------------------------------------------------------------------------------------------
function showSamples(n, train, val) {
  const s = $("samples");
  s.dataset.count = String(n);
  s.textContent = plural(n, "sample") + (train === undefined ? "" : ` (${train} to train, ${val} to check)`);
}

async function addSample(label) {
  if (!state.lastPixels) {
    say("draw a digit first, then tap what it is", true);
    return;
  }
  try {
    const r = await api("/api/add", { pixels: asInput(state.lastPixels), label });
    showSamples(r.samples);
    say(`added as a ${r.label} (sample ${r.id}); draw the next one`);
    clearDrawing();
    refreshStatus();
  } catch (e) {
    say(`not added: ${e.message}`, true);
  }
}
for (let k = 0; k < 10; k++) $(`label-${k}`).addEventListener("click", () => addSample(k));

async function refreshStatus() {
  try {
    const st = await api("/api/status");
    if (st.input_shape) state.inputShape = st.input_shape;
    if (st.input_range) state.inputRange = st.input_range;
    showSamples(st.samples, st.train_samples, st.val_samples);
    showVersion(st.model_version);
    $("personalize").title = st.policy;
  } catch (e) {
    say(`no answer from the app: ${e.message}`, true);
  }
}

// ---- a burst ----------------------------------------------------------------------------------------------
const num = (v) => (v === null || v === undefined ? "-" : Number(v).toPrecision(4));

function words(r) {
  if (!r.steps && r.val_loss_before === null) return { text: `No burst: ${r.reason}.`, kind: "none" }; // not run
  const how = r.val_accuracy_before !== null && r.val_accuracy_after !== null
    ? `validation accuracy ${pct(r.val_accuracy_before)} → ${pct(r.val_accuracy_after)}`
    : r.val_loss_before !== null && r.val_loss_after !== null
      ? `validation loss ${num(r.val_loss_before)} → ${num(r.val_loss_after)}`
      : "";
  return verdict(r, how);
}

function showProgress(p) {
  const loss = p.loss === null ? "" : ` · loss ${Number(p.loss).toPrecision(3)}`;
  $("progress").textContent = p.running
    ? `training: step ${p.step} of at most ${p.of}${loss}`
    : `done: ${plural(p.step, "step")}${loss}`;
  $("progress").dataset.step = String(p.step);
}

const burst = bursts(state, {
  progress: showProgress,
  pause: 200,
  describe: words,
  data: (r) => ({ version: String(r.model_version) }),
  after: async () => {
    await Promise.all([refreshStatus(), refreshChart()]);
    if (state.lastPixels) predict(); // the drawing, read again by the model as it is now
  },
});

// ---- the chart --------------------------------------------------------------------------------------------
const SVG = "http://www.w3.org/2000/svg";
function el(name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function drawChart(points, current) {
  const svg = $("chart");
  svg.textContent = "";
  const W = 320, H = 170, L = 36, R = 12, T = 14, B = 24;
  const metric = points.some((p) => p.accuracy !== null) ? "accuracy" : "loss";
  const pts = points.filter((p) => p[metric] !== null);
  svg.dataset.metric = metric;
  svg.dataset.points = String(pts.length);
  if (!pts.length) {
    svg.append(el("text", { x: W / 2, y: H / 2, class: "empty" }, "no kept versions yet: personalize to start the curve"));
    return;
  }
  const vals = pts.map((p) => p[metric]);
  let lo, hi;
  if (metric === "accuracy") { // from a multiple of 20% below the lowest point to 100%: round grid lines
    lo = Math.max(0, Math.floor((Math.min(...vals) - 0.05) * 5) / 5);
    hi = 1;
  } else {
    lo = 0;
    hi = Math.max(...vals) * 1.1 || 1;
  }
  const v0 = pts[0].version, v1 = Math.max(pts[pts.length - 1].version, v0 + 1);
  const sx = (v) => L + (v - v0) / (v1 - v0) * (W - L - R);
  const sy = (y) => T + (hi - y) / (hi - lo) * (H - T - B);
  const fmt = metric === "accuracy" ? (v) => `${Math.round(100 * v)}%` : (v) => Number(v).toPrecision(3);
  for (const y of [lo, (lo + hi) / 2, hi]) {
    svg.append(el("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), class: "grid" }));
    svg.append(el("text", { x: L - 4, y: sy(y) + 3, class: "tick", "text-anchor": "end" }, fmt(y)));
  }
  svg.append(el("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
  svg.append(el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
  const every = Math.ceil(pts.length / 12); // labels of at most 12 versions, the last one always
  svg.append(el("polyline", { class: "curve", points: pts.map((p) => `${sx(p.version)},${sy(p[metric])}`).join(" ") }));
  pts.forEach((p, i) => {
    const x = sx(p.version), y = sy(p[metric]);
    const c = el("circle", {
      cx: x, cy: y, r: 4, class: p.version === current ? "point current" : "point",
      "data-version": p.version, "data-value": p[metric],
    });
    c.append(el("title", {}, `version ${p.version}: ${metric} ${fmt(p[metric])}`));
    svg.append(c);
    if (i % every === 0 || i === pts.length - 1) {
      svg.append(el("text", { x, y: H - B + 13, class: "tick", "text-anchor": "middle" }, `v${p.version}`));
      svg.append(el("text", { x, y: y - 8, class: "value" }, fmt(p[metric])));
    }
  });
}

async function refreshChart() {
  try {
    const h = await api("/api/history");
    drawChart(h.points, h.version);
  } catch (e) {
    say(`no history: ${e.message}`, true);
  }
}

// ---- start ------------------------------------------------------------------------------------------------
render();
drawPreview(null);
say("");
refreshStatus();
refreshChart();
burst.resume();
