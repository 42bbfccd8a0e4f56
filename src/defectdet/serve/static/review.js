// defectdet review page: plain JS, no build step, no network beyond this service.
// Every decision is POSTed at once (with the token, X-Defectdet-Request and a JSON body) and saved as labels.
//
// The boxes of an image are of two sources: "label" (the operator's, or a proposal the operator touched) and
// "model" (a proposal of the model, with its score). Proposals scoring under the slider are hidden; the slider
// starts at the model's threshold on every image. Saving an edit writes the operator's labels only; accept
// writes them plus the proposals shown at that moment, never hidden ones.
//
// Undo is saved too: a change of the labels is undone on the server (the label file as it was before it), and
// with nothing left to undo on the image, Ctrl+Z takes back this page's last accept, clean, skip or reset (or,
// after a reload, the shown image's last decision). While such a decision is being saved, the decision and
// navigation keys are ignored: a repeated key never decides the next image unseen.
"use strict";

const $ = (id) => document.getElementById(id);
const COLORS = ["#e53935", "#1e88e5", "#43a047", "#fb8c00", "#8e24aa", "#00acc1", "#6d4c41", "#c0ca33", "#ec407a"];
const MAX_ENLARGE = 8;        // a small image is enlarged to fit the stage, at most this much
const ZOOM_RANGE = [0.5, 40]; // zoom relative to the fitted view
const HANDLE = 7;             // corner handle half-size, screen pixels
const LABEL_H = 15;           // a box label's height, screen pixels
const MIN_DRAG = 4;           // screen pixels before a press becomes a drag
const FINAL = new Set(["accept", "clean", "skip"]);
const STATUS_NAMES = { pending: "unreviewed", edit: "edited", accept: "accepted", clean: "clean", skip: "skipped", labelled: "labelled" };
const TOKEN_KEY = "defectdet-token";
const OPERATOR_KEY = "defectdet-operator";
let tokenAsked = false;

const state = {
  items: [], classNames: [], index: -1, boxes: [], selected: -1, nextClass: 0,
  threshold: null, minScore: 0, image: null, view: { s: 1, tx: 0, ty: 0 }, fitted: 1,
  nextNumber: 1,  // the number the next box shown for the first time on this image gets (numberBoxes)
  plane: "image", planes: {},  // the plane shown (the image or a companion capture) and the loaded ones
  drag: null, space: false, undo: [], memory: new Map(), saved: 0, broken: new Set(), saving: Promise.resolve(),
  busy: false,   // a decision that moves on (or an undo or reset) is being saved
  history: [],   // the images this page accepted, cleaned, skipped or reset, oldest first: Ctrl+Z takes them back
};
const TAKEN_BACK = new Set(["accept", "clean", "skip", "reset"]);  // decisions the page-wide undo takes back

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function withToken(options) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = new Headers((options && options.headers) || {});
  if (token) headers.set("Authorization", "Bearer " + token);
  return { ...(options || {}), headers };
}

// fetch with the token; on 401 ask for it once per page load and retry
async function call(url, options) {
  const sent = sessionStorage.getItem(TOKEN_KEY);
  let response = await fetch(url, withToken(options));
  if (response.status === 401) {
    if (sessionStorage.getItem(TOKEN_KEY) === sent && !tokenAsked) {
      tokenAsked = true;
      const token = window.prompt("This service needs its access token (--token-file):");
      if (token) { sessionStorage.setItem(TOKEN_KEY, token.trim()); tokenAsked = false; }
    }
    if (sessionStorage.getItem(TOKEN_KEY) !== sent) response = await fetch(url, withToken(options));
  }
  return response;
}

async function getJson(url, options) {
  const response = await call(url, options);
  let body = null;
  try { body = await response.json(); } catch (e) { body = { error: response.statusText }; }
  return { ok: response.ok, status: response.status, body };
}

function postJson(url, payload) {
  return getJson(url, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Defectdet-Request": "1" },
    body: JSON.stringify(payload),
  });
}

function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "muted";
}

// ------------------------------------------------------------------ boxes
function kind(b) {
  if (b.source === "label") return "label";
  return state.threshold != null && b.score != null && b.score < state.threshold ? "near" : "detection";
}

function shown(b) {
  return b.source === "label" || b.score == null || b.score >= state.minScore;
}

// Box numbers are short and stable while the operator works on an image: a box gets its number the first time
// it is shown (the operator's boxes first, then the proposals by score, highest first), and keeps it when the
// slider hides it and shows it again, when it is moved, resized or re-classed, and when the operator comes back
// to the image. A drawn box takes the next number. Proposals never shown get none, and a number is never given
// twice on an image (a deleted box's number is not reused).
function numberBoxes() {
  const rank = (b) => (b.source === "label" ? 0 : b.score == null ? 1 : 2);
  const fresh = state.boxes.filter((b) => b.n == null && shown(b));
  fresh.sort((p, q) => rank(p) - rank(q) || (rank(p) === 2 ? q.score - p.score : 0));
  for (const b of fresh) b.n = state.nextNumber++;
}

function iou(a, b) {
  const w = Math.min(a[2], b[2]) - Math.max(a[0], b[0]);
  const h = Math.min(a[3], b[3]) - Math.max(a[1], b[1]);
  if (w <= 0 || h <= 0) return 0;
  const inter = w * h;
  return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter);
}

function clip(box, size) {
  const [w, h] = size;
  const xs = [box[0], box[2]].map((v) => Math.min(Math.max(v, 0), w)).sort((p, q) => p - q);
  const ys = [box[1], box[3]].map((v) => Math.min(Math.max(v, 0), h)).sort((p, q) => p - q);
  return [xs[0], ys[0], xs[1], ys[1]];
}

function imageSize() {
  return state.image ? [state.image.width, state.image.height] : [Infinity, Infinity];
}

// the page's boxes of an item: its label file's boxes, and (until a final decision) the model's proposals that
// no label already covers; empty proposals are dropped
function boxesOf(item) {
  const labels = item.has_labels ? item.boxes : [];
  const boxes = labels.map((b) => ({ class_id: b.class_id, box: b.box.slice(), score: null, source: "label" }));
  if (!FINAL.has(item.status) && !item.proposals_cleared) {
    for (const p of item.predictions || []) {
      if (p.box[2] - p.box[0] < 1 || p.box[3] - p.box[1] < 1) continue;
      if (labels.some((l) => l.class_id === p.class_id && iou(l.box, p.box) >= 0.9)) continue;
      boxes.push({ class_id: p.class_id, box: p.box.slice(), score: p.score == null ? null : p.score, source: "model" });
    }
  }
  return boxes;
}

function labelBoxes() {
  return state.boxes.filter((b) => b.source === "label");
}

function snapshot() {
  state.undo.push({ boxes: state.boxes.map((b) => ({ ...b, box: b.box.slice() })), labels: JSON.stringify(labelBoxes()) });
  if (state.undo.length > 200) state.undo.shift();
}

// ------------------------------------------------------------------ the list
async function loadFolder() {
  const { ok, body } = await getJson("/v1/review/items");
  if (!ok) { setStatus("cannot list the folder: " + (body.error || "error"), true); return; }
  state.items = body.items;
  state.classNames = body.class_names;
  $("folder").textContent = "folder " + body.folder;
  if (!$("operator").value) $("operator").value = localStorage.getItem(OPERATOR_KEY) || body.operator || "";
  for (const item of state.items) if (item.error) state.broken.add(item.name);
  const reasons = [...new Set(state.items.flatMap((item) => item.reasons || []))].sort();
  $("filter-reason").innerHTML = `<option value="">any reason</option>` +
    reasons.map((r) => `<option value="${escapeHtml(r)}">${escapeHtml(r)}</option>`).join("") +
    `<option value="-">none (not kept by serve)</option>`;
  renderClasses();
  renderList();
  const first = state.items.findIndex((item) => !item.error && (item.status === "pending" || item.status === "labelled"));
  await show(first >= 0 ? first : nextUsable(-1, 1));
  if (!state.items.length) setStatus("no images in this folder");
}

function statusOf(item) {
  return state.broken.has(item.name) ? "error" : item.status;
}

function matches(item) {
  const wanted = $("filter-status").value;
  const reason = $("filter-reason").value;
  if (wanted && statusOf(item) !== wanted) return false;
  if (reason === "-") return !(item.reasons && item.reasons.length);
  return !reason || (item.reasons || []).includes(reason);
}

function renderCounts() {
  const counts = {};
  for (const item of state.items) {
    if (!state.broken.has(item.name)) counts[item.status] = (counts[item.status] || 0) + 1;
  }
  const parts = Object.entries(counts).map(([k, v]) => `${v} ${STATUS_NAMES[k] || k}`);
  $("counts").textContent = `${state.items.length} images · ${parts.join(" · ")} · cannot be shown: ${state.broken.size}`;
  $("counts").dataset.broken = String(state.broken.size);
}

// a kept name in the list: its start (cut with an ellipsis when the pane is too narrow) and its end, always shown
function nameHtml(name, title) {
  const chars = Array.from(name);
  const keep = Math.min(12, Math.floor(chars.length / 2));
  const head = chars.slice(0, chars.length - keep).join("");
  const tail = chars.slice(chars.length - keep).join("");
  return `<span class="name" title="${escapeHtml(title)}"><span class="head">${escapeHtml(head)}</span>` +
    `<span class="tail">${escapeHtml(tail)}</span></span>`;
}

function renderList() {
  let listed = 0;
  $("items").innerHTML = state.items.map((item, i) => {
    if (!matches(item) && i !== state.index) return "";
    listed += 1;
    const broken = state.broken.has(item.name);
    const label = broken ? "error" : STATUS_NAMES[item.status] || item.status;
    const reasons = (item.reasons || []).join(", ");
    const named = [item.name, item.upload_name].filter(Boolean).join(" · uploaded as ");
    return `<li data-index="${i}" data-status="${escapeHtml(statusOf(item))}" class="${i === state.index ? "current" : ""} ${broken ? "error" : ""}" ` +
      `title="${escapeHtml(item.error || item.label_error || named)}">${nameHtml(item.name, named)}` +
      `<span class="state">${escapeHtml(label)}${reasons ? " · kept: " + escapeHtml(reasons) : ""}</span></li>`;
  }).join("");
  $("list-count").textContent = `${listed} of ${state.items.length} listed`;
  renderCounts();
}

function renderClasses() {
  const selected = state.selected >= 0 ? state.boxes[state.selected] : null;
  $("classes").innerHTML = state.classNames.map((name, i) =>
    `<button type="button" data-class="${i}" class="${i === state.nextClass ? "current" : ""} ${selected && selected.class_id === i ? "selected-class" : ""}">` +
    `${i < 9 ? i + 1 + " " : ""}${escapeHtml(name)}</button>`).join("");
  $("next-class").textContent = state.classNames[state.nextClass] || "";
  $("selected-rule").textContent = selected
    ? `Box ${selected.n} (${state.classNames[selected.class_id] || selected.class_id}) is selected: the keys re-class it; Esc deselects.`
    : "A new box is not selected after drawing; click a box to select it, then the keys re-class it.";
}

function nextUsable(from, step) {
  for (let i = from + step; i >= 0 && i < state.items.length; i += step) {
    if (!state.broken.has(state.items[i].name) && matches(state.items[i])) return i;
  }
  return -1;
}

// ------------------------------------------------------------------ one item
async function fetchImage(url) {
  const response = await call(url);
  if (!response.ok) {
    let reason = response.statusText;
    try { reason = (await response.json()).error || reason; } catch (e) { /* not JSON */ }
    return { image: null, error: reason };
  }
  try {
    return { image: await createImageBitmap(await response.blob()), error: null };
  } catch (e) {
    return { image: null, error: "the browser cannot show this image" };
  }
}

function rememberCurrent() {
  const item = state.items[state.index];
  if (item && state.image && !FINAL.has(item.status)) {
    state.memory.set(item.name, { status: item.status, boxes: state.boxes, nextNumber: state.nextNumber });
  }
}

function renderItemHead(item) {
  $("item-name").textContent = item.name;
  $("item-status").textContent = STATUS_NAMES[item.status] || item.status;
  $("item-status").className = "badge " + item.status;
  // why the image is here and who decided it first; where it came from after (the header wraps between parts)
  const parts = [];
  if (item.verdict) parts.push(["verdict", "model: " + item.verdict]);
  if (item.reasons && item.reasons.length) parts.push(["kept", "kept: " + item.reasons.join(", ")]);
  if (item.operator) parts.push(["decided", `decided by ${item.operator}` + (item.decided ? ` at ${item.decided}` : "")]);
  if (item.upload_name) parts.push(["uploaded", "uploaded as " + item.upload_name]);
  if (item.captured) parts.push(["captured", "captured " + item.captured]);
  const info = $("item-info");
  info.replaceChildren();
  parts.forEach(([part, text], i) => {
    if (i) info.append(" · ");
    const span = document.createElement("span");
    span.dataset.part = part;
    span.textContent = text;
    info.append(span);
  });
  $("label-error").hidden = !item.label_error;
  $("label-error").textContent = item.label_error
    ? item.label_error + " — the file is kept as it is until you decide (showing the model's boxes)" : "";
}

function setThreshold(threshold) {
  state.threshold = typeof threshold === "number" && isFinite(threshold) ? threshold : null;
  state.minScore = state.threshold == null ? 0 : state.threshold;
  $("min-score").value = String(state.minScore);
  $("min-score-value").textContent = state.minScore.toFixed(3);
  $("threshold-note").textContent = state.threshold == null
    ? "(no model threshold recorded: all shown)"
    : `(model threshold ${state.threshold.toFixed(3)})`;
}

async function show(index) {
  if (index < 0 || index >= state.items.length) return;
  rememberCurrent();
  state.index = index;
  state.image = null;
  delete $("canvas").dataset.size;  // loading
  const item = state.items[index];
  const remembered = state.memory.get(item.name);
  const resumed = remembered && remembered.status === item.status;
  state.boxes = resumed ? remembered.boxes : boxesOf(item);
  state.nextNumber = resumed ? remembered.nextNumber : 1;
  const empty = (item.predictions || []).length - (item.predictions || []).filter((p) => p.box[2] - p.box[0] >= 1 && p.box[3] - p.box[1] >= 1).length;
  state.selected = -1;
  state.undo = [];
  state.drag = null;
  setThreshold(item.threshold);
  renderItemHead(item);
  renderClasses();
  renderList();
  const loaded = item.error ? { image: null, error: item.error } : await fetchImage("/v1/review/image/" + encodeURIComponent(item.name));
  if (state.index !== index) return;  // the operator moved on meanwhile
  if (!loaded.image) {
    markBroken(item, loaded.error);
    return;
  }
  $("item-error").hidden = true;
  state.image = loaded.image;
  state.planes = { image: loaded.image };
  state.boxes = state.boxes.map((b) => ({ ...b, box: clip(b.box, imageSize()) }));
  renderViews(item);
  renderProposalCount();  // the page around the stage as it will be, then the image fitted to the stage
  fitView();
  render();
  if (state.plane !== "image") showPlane(planesOf(item).includes(state.plane) ? state.plane : "image");
  else $("canvas").dataset.plane = "image";
  showTemplate(item, index);
  setStatus(`${index + 1} / ${state.items.length}` + (empty ? ` · ${empty} empty proposal${empty === 1 ? "" : "s"} dropped` : ""));
}

// ------------------------------------------------------------------ view: the image or a companion capture
function planesOf(item) {
  return ["image", ...((item && item.companions) || [])];
}

function renderViews(item) {
  const planes = planesOf(item);
  $("views").hidden = planes.length < 2;
  $("view-buttons").innerHTML = planes.map((name) =>
    `<button type="button" data-plane="${escapeHtml(name)}" title="v: next view">${escapeHtml(name)}</button>`).join(" ");
  markView();
}

function markView() {
  for (const button of $("view-buttons").querySelectorAll("button[data-plane]")) {
    button.classList.toggle("active", button.dataset.plane === state.plane);
  }
}

// the companion is an aligned capture of the same size: the boxes stay where they are
async function showPlane(name) {
  const item = state.items[state.index];
  if (!item || !state.planes.image) return;
  const index = state.index;
  if (!state.planes[name]) {
    const loaded = await fetchImage(`/v1/review/companion/${encodeURIComponent(name)}/${encodeURIComponent(item.name)}`);
    if (state.index !== index) return;
    if (!loaded.image) { setStatus(`companion ${name}: ${loaded.error}`); return; }
    state.planes[name] = loaded.image;
  }
  const shownPlane = state.planes[name];
  if (shownPlane.width !== state.planes.image.width || shownPlane.height !== state.planes.image.height) {
    setStatus(`companion ${name} is ${shownPlane.width}x${shownPlane.height}, the image ` +
      `${state.planes.image.width}x${state.planes.image.height}: not shown`);
    return;
  }
  state.plane = name;
  state.image = shownPlane;
  $("canvas").dataset.plane = name;
  markView();
  draw();
}

function nextView() {
  const planes = planesOf(state.items[state.index]);
  if (planes.length < 2) return;
  showPlane(planes[(planes.indexOf(state.plane) + 1) % planes.length]);
}

async function showTemplate(item, index) {
  $("template-box").hidden = true;
  if (!item.template) return;
  const t = await fetchImage("/v1/review/template/" + encodeURIComponent(item.name));
  if (!t.image || state.index !== index) return;
  const template = $("template");
  const scale = Math.min(220 / t.image.width, 200 / t.image.height, MAX_ENLARGE);
  template.width = Math.max(1, Math.round(t.image.width * scale));
  template.height = Math.max(1, Math.round(t.image.height * scale));
  const context = template.getContext("2d");
  context.imageSmoothingEnabled = scale < 1;
  context.drawImage(t.image, 0, 0, template.width, template.height);
  $("template-box").hidden = false;
}

function markBroken(item, reason) {
  state.broken.add(item.name);
  item.error = reason;
  state.image = null;
  state.boxes = [];
  $("item-error").hidden = false;
  $("item-error").textContent = `${item.name}: ${reason} (skipped)`;
  const canvas = $("canvas");
  canvas.dataset.boxes = "0";
  canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
  renderList();
  renderTable();
  setStatus(`${item.name} cannot be shown: skipped`, true);
}

// ------------------------------------------------------------------ view: zoom and pan
function sizeCanvas() {
  const canvas = $("canvas");
  const stage = $("stage");
  canvas.width = Math.max(1, stage.clientWidth);
  canvas.height = Math.max(1, stage.clientHeight);
}

function fitView() {
  sizeCanvas();
  if (!state.image) return;
  const canvas = $("canvas");
  const s = Math.min(MAX_ENLARGE, canvas.width / state.image.width, canvas.height / state.image.height);
  state.fitted = s;
  state.view = { s, tx: (canvas.width - state.image.width * s) / 2, ty: (canvas.height - state.image.height * s) / 2 };
  state.view.fit = true;  // until the operator zooms or pans: a stage that changes size fits the image again
}

function toScreen(x, y) {
  return [x * state.view.s + state.view.tx, y * state.view.s + state.view.ty];
}

function toImage(x, y) {
  return [(x - state.view.tx) / state.view.s, (y - state.view.ty) / state.view.s];
}

function zoomAt(factor, sx, sy) {
  const s = Math.min(Math.max(state.view.s * factor, state.fitted * ZOOM_RANGE[0]), state.fitted * ZOOM_RANGE[1]);
  const [ix, iy] = toImage(sx, sy);
  state.view = { s, tx: sx - ix * s, ty: sy - iy * s };
  draw();
}

// ------------------------------------------------------------------ drawing
function render() {
  draw();
  renderTable();
  renderClasses();
}

function labelText(b) {
  const name = state.classNames[b.class_id] || b.class_id;
  return kind(b) === "label" || b.score == null ? `${b.n} ${name}` : `${b.n} ${name} ${Number(b.score).toFixed(2)}`;
}

function overlaps(a, b) {
  return a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
}

// Where each shown box's label goes, the operator's boxes first, then the proposals by number: above the box's
// top left corner; where another label is there, below the box, then beside it (right, left), inside it under
// its top edge (a box tall enough), then further up or down (a thin line leads back), the first spot free.
// Returns index -> { n, text, rect, detached }.
function placeLabels(context, shownIndices) {
  const canvas = $("canvas");
  const rank = { label: 0, detection: 1, near: 2 };
  const order = shownIndices.slice().sort((p, q) => rank[kind(state.boxes[p])] - rank[kind(state.boxes[q])] ||
    state.boxes[p].n - state.boxes[q].n);
  const placed = new Map();
  const taken = [];
  for (const i of order) {
    const b = state.boxes[i];
    const [x1, y1] = toScreen(b.box[0], b.box[1]);
    const [x2, y2] = toScreen(b.box[2], b.box[3]);
    const text = labelText(b);
    const w = Math.ceil(context.measureText(text).width) + 8;
    const spots = [[x1 - 1.5, y1 - LABEL_H - 1], [x1 - 1.5, y2 + 2], [x2 + 3, y1 + 2], [x1 - w - 3, y1 + 2]];
    if (y2 - y1 >= 3 * LABEL_H) spots.push([x1 + 3, y1 + 3]);
    const adjacent = spots.length;  // the spots touching the box; the ones further up or down are detached
    for (let k = 1; k <= 30; k++) {
      spots.push([x1 - 1.5, y1 - LABEL_H - 1 - k * (LABEL_H + 1)], [x1 - 1.5, y2 + 2 + k * (LABEL_H + 1)]);
    }
    const at = ([x, y]) => ({ x: Math.max(0, Math.min(x, canvas.width - w)), y: Math.max(0, Math.min(y, canvas.height - LABEL_H)), w, h: LABEL_H });
    const free = spots.findIndex((spot) => !taken.some((other) => overlaps(other, at(spot))));
    const rect = at(spots[Math.max(free, 0)]);
    taken.push(rect);
    placed.set(i, { n: b.n, text, rect, detached: free >= adjacent });
  }
  return placed;
}

function drawBox(context, b, label) {
  const [x1, y1] = toScreen(b.box[0], b.box[1]);
  const [x2, y2] = toScreen(b.box[2], b.box[3]);
  const color = COLORS[b.class_id % COLORS.length];
  const k = kind(b);
  const { x, y, w, h } = label.rect;
  context.save();
  context.strokeStyle = color;
  context.fillStyle = color;
  if (k === "label") {
    context.lineWidth = 3;
    context.strokeRect(x1, y1, x2 - x1, y2 - y1);
  } else {
    if (k === "near") { context.globalAlpha = 0.55; context.setLineDash([5, 4]); }
    context.lineWidth = 1.5;
    context.strokeRect(x1, y1, x2 - x1, y2 - y1);
    if (k === "detection") { context.globalAlpha = 0.13; context.fillRect(x1, y1, x2 - x1, y2 - y1); context.globalAlpha = 1; }
    context.setLineDash([]);
  }
  if (label.detached) {  // a label moved away from its box: a thin line leads back to the box's corner
    context.lineWidth = 1;
    context.beginPath();
    context.moveTo(x + 1, y < y1 ? y + h : y);
    context.lineTo(x1, y < y1 ? y1 : y2);
    context.stroke();
  }
  if (k !== "label") {  // a proposal's label: a dark backing (it reads on a bright or busy image), its colour at the left
    context.fillStyle = "rgba(20, 22, 30, 0.75)";
    context.fillRect(x, y, w, h);
    context.fillStyle = color;
  }
  context.fillRect(x, y, k === "label" ? w : 3, h);
  context.fillStyle = "#fff";
  context.fillText(label.text, x + 4, y + 12);
  context.restore();
}

function drawSelection(context, b) {
  const [x1, y1] = toScreen(b.box[0], b.box[1]);
  const [x2, y2] = toScreen(b.box[2], b.box[3]);
  context.save();
  context.strokeStyle = "#ffeb3b";
  context.lineWidth = 2;
  context.setLineDash([6, 3]);
  context.strokeRect(x1 - 3, y1 - 3, x2 - x1 + 6, y2 - y1 + 6);
  context.setLineDash([]);
  context.fillStyle = "#ffeb3b";
  context.strokeStyle = "#1d2330";
  context.lineWidth = 1;
  for (const [x, y] of [[x1, y1], [x2, y1], [x1, y2], [x2, y2]]) {
    context.fillRect(x - HANDLE + 2, y - HANDLE + 2, 2 * HANDLE - 4, 2 * HANDLE - 4);
    context.strokeRect(x - HANDLE + 2, y - HANDLE + 2, 2 * HANDLE - 4, 2 * HANDLE - 4);
  }
  context.restore();
}

function draw() {
  const canvas = $("canvas");
  const context = canvas.getContext("2d");
  context.fillStyle = "#222";
  context.fillRect(0, 0, canvas.width, canvas.height);
  if (!state.image) return;
  context.imageSmoothingEnabled = state.view.s < 1; // enlarged pixels stay sharp: a thin scratch is not blurred
  const [ox, oy] = toScreen(0, 0);
  context.drawImage(state.image, ox, oy, state.image.width * state.view.s, state.image.height * state.view.s);
  drawAnomalyMap(context, ox, oy);  // under the boxes
  context.font = "12px system-ui, sans-serif";
  numberBoxes();
  const visibleIndices = state.boxes.map((b, i) => i).filter((i) => shown(state.boxes[i]));
  const visible = visibleIndices.length, hidden = state.boxes.length - visible;
  const labels = placeLabels(context, visibleIndices);
  // near misses first, operator labels last (on top)
  const order = visibleIndices.sort((p, q) => ["near", "detection", "label"].indexOf(kind(state.boxes[p])) -
    ["near", "detection", "label"].indexOf(kind(state.boxes[q])));
  for (const i of order) drawBox(context, state.boxes[i], labels.get(i));
  if (state.selected >= 0 && state.boxes[state.selected]) drawSelection(context, state.boxes[state.selected]);
  const d = state.drag;
  if (d && d.mode === "draw" && d.moved) {
    context.strokeStyle = "#ffeb3b";
    context.lineWidth = 2;
    context.strokeRect(Math.min(d.sx0, d.sx), Math.min(d.sy0, d.sy), Math.abs(d.sx - d.sx0), Math.abs(d.sy - d.sy0));
  }
  canvas.dataset.boxes = String(visible);
  canvas.dataset.hidden = String(hidden);
  canvas.dataset.labels = String(labelBoxes().length);
  canvas.dataset.view = JSON.stringify(state.view);
  canvas.dataset.size = JSON.stringify([state.image.width, state.image.height]);
  // each shown box's number and its label's rectangle on the canvas (canvas pixels)
  canvas.dataset.labelRects = JSON.stringify([...labels.values()].map(({ n, rect }) => ({ n, ...rect })));
  renderProposalCount();
}

function renderProposalCount() {
  const proposals = state.boxes.length - labelBoxes().length;
  const hidden = state.boxes.filter((b) => !shown(b)).length;
  $("proposal-count").textContent = `${proposals - hidden} of ${proposals} shown`;
  $("proposal-count").title = `${proposals - hidden} of the model's ${proposals} proposals shown` +
    (hidden ? `; ${hidden} scoring under the slider hidden` : "");
}

function renderTable() {
  const names = { label: "yours", detection: "model", near: "near miss" };
  numberBoxes();
  const rows = state.boxes.map((b, i) => i).filter((i) => shown(state.boxes[i]));
  rows.sort((p, q) => state.boxes[p].n - state.boxes[q].n);
  $("boxes").querySelector("tbody").innerHTML = rows.map((i) => {
    const b = state.boxes[i];
    const k = kind(b);
    const source = names[k] + (b.score == null ? "" : " " + Number(b.score).toFixed(2));
    return `<tr data-index="${i}" data-number="${b.n}" data-source="${k}" data-class="${b.class_id}" class="${i === state.selected ? "selected" : ""} ${k}" ` +
      `title="x1, y1, x2, y2: ${b.box.map((v) => Math.round(v)).join(", ")}"><td>${b.n}</td>` +
      `<td>${escapeHtml(state.classNames[b.class_id] || b.class_id)}</td><td>${source}</td></tr>`;
  }).join("");
}

// ------------------------------------------------------------------ decisions
function payloadBoxes(action) {
  const chosen = action === "accept" ? state.boxes.filter(shown) : labelBoxes();
  return chosen.map((b) => ({ class_id: b.class_id, box: b.box.map((v) => Math.round(v * 100) / 100) }));
}

// what a decision sends is taken when it is made; decisions are sent one after the other, in that order.
// `extra`: more fields of the decision (proposals_cleared); `name`: another image than the one shown
function decide(action, extra, name) {
  const item = name ? state.items.find((i) => i.name === name) : state.items[state.index];
  if (!item) return Promise.resolve(false);
  if (state.broken.has(item.name) && !["skip", "reset", "undo"].includes(action)) { setStatus("an image that cannot be shown can only be skipped", true); return Promise.resolve(false); }
  const operator = $("operator").value.trim();
  if (!operator) { setStatus("type your name in the Operator field first", true); $("operator").focus(); return Promise.resolve(false); }
  localStorage.setItem(OPERATOR_KEY, operator);
  const boxes = action === "accept" || action === "edit" ? payloadBoxes(action) : [];
  const run = state.saving.then(() => send({ image: item.name, action, boxes, operator, ...(extra || {}) }));
  state.saving = run.catch(() => false);
  return run;
}

// each decision names the version of the image it was made on (the last one this page read or saved); a save
// made elsewhere in between answers 409: the page says so and reloads that image
async function send(decision) {
  const known = state.items.find((item) => item.name === decision.image);
  if (known && typeof known.version === "number") decision = { ...decision, version: known.version };
  const { ok, status, body } = await postJson("/v1/review/decide", decision);
  if (status === 409) { await reloadStale(decision.image, body.error); return false; }
  if (!ok) { setStatus(`not saved (${decision.image}): ${body.error || "error"}`, true); return false; }
  const index = state.items.findIndex((item) => item.name === decision.image);
  if (index >= 0) state.items[index] = body;
  state.saved += 1;
  document.body.dataset.saved = String(state.saved);
  const count = decision.boxes.length;
  const dropped = (body.dropped || []).length ? ` · ${body.dropped.length} empty box(es) dropped` : "";
  if (decision.action === "undo") setStatus(`undone on ${decision.image}: now ${STATUS_NAMES[body.status] || body.status}`);
  else setStatus(`saved: ${decision.image} ${decision.action} (${count} box${count === 1 ? "" : "es"})${dropped}`);
  if (index === state.index) renderItemHead(body);
  if (decision.action !== "edit") state.memory.delete(decision.image);
  if (TAKEN_BACK.has(decision.action)) {
    state.history.push(decision.image);
    if (state.history.length > 200) state.history.shift();
  }
  renderList();
  return true;
}

// another tab or client saved a decision on `name` first: nothing of ours was written; show what is saved now
async function reloadStale(name, reason) {
  const { ok, body } = await getJson("/v1/review/items");
  const fresh = ok ? body.items.find((item) => item.name === name) : null;
  const index = state.items.findIndex((item) => item.name === name);
  if (fresh && index >= 0) state.items[index] = fresh;
  state.memory.delete(name);
  if (index >= 0 && index === state.index) { state.image = null; await show(index); }  // nothing remembered
  renderList();
  setStatus(`not saved: ${reason || name + " was changed elsewhere"} (reloaded ${name})`, true);
  document.body.dataset.stale = name;  // last: the reload is shown and the message says why
}

// one decision that moves on (or reloads) at a time: a key pressed again meanwhile is ignored
async function once(work) {
  if (state.busy) return;
  state.busy = true;
  document.body.dataset.busy = "1";
  try { await work(); } finally { state.busy = false; delete document.body.dataset.busy; }
}

function decideAndNext(action) {
  return once(async () => {
    if (await decide(action)) {
      const next = nextUsable(state.index, 1);
      if (next >= 0) await show(next); else { renderList(); setStatus("saved; that was the last image in the list", false); }
    }
  });
}

// show the image `name` again as the server has it now (after an undo or a reset)
async function reshow(name) {
  const index = state.items.findIndex((item) => item.name === name);
  if (index < 0) return;
  state.memory.delete(name);
  if (index === state.index) state.image = null;  // nothing of the old boxes is remembered
  await show(index);
}

function resetImage() {
  const item = state.items[state.index];
  if (!item) return Promise.resolve();
  return once(async () => {
    if (await decide("reset")) { await reshow(item.name); setStatus(`${item.name} is unreviewed again (Undo brings its labels back)`); }
  });
}

// a change of the operator's labels: saved as an edit; the undo step taken just before it (snapshot) learns
// whether it was saved, so undoing it takes it back on the server too
function changed(extra) {
  render();
  const step = state.undo[state.undo.length - 1];
  const run = decide("edit", extra);
  if (step && !step.saved) step.saved = run;
}

function setClass(classId) {
  if (classId >= state.classNames.length) return;
  if (state.selected >= 0) {
    snapshot();
    const b = state.boxes[state.selected];
    b.class_id = classId;
    b.source = "label";
    b.score = null;
    changed();
  } else {
    state.nextClass = classId;
    renderClasses();
  }
}

function deleteSelected() {
  if (state.selected < 0) return;
  snapshot();
  const wasLabel = state.boxes[state.selected].source === "label";
  state.boxes.splice(state.selected, 1);
  state.selected = -1;
  if (wasLabel) changed(); else render();
}

// Ctrl+Z: the last change on this image (taken back on the server when it was saved); with none left, this
// page's last accept, clean, skip or reset; after a reload, the shown image's last decision
async function undo() {
  if (state.busy) return;
  const last = state.undo.pop();
  if (last) {
    state.boxes = last.boxes;
    state.selected = -1;
    render();
    if (last.saved && await last.saved) await decide("undo");
    else setStatus("undone");
    return;
  }
  const item = state.items[state.index];
  const name = state.history.pop() || (item && item.undoable ? item.name : null);
  if (!name) { setStatus("nothing to undo"); return; }
  await once(async () => { if (await decide("undo", null, name)) await reshow(name); });
}

// saved: reopening the page does not bring them back (Undo does)
function clearProposals() {
  if (!state.boxes.some((b) => b.source !== "label")) return;
  snapshot();
  state.boxes = state.boxes.filter((b) => b.source === "label");
  state.selected = -1;
  changed({ proposals_cleared: true });
}

// ------------------------------------------------------------------ mouse
function canvasPoint(event) {
  const canvas = $("canvas");
  const rect = canvas.getBoundingClientRect();
  return [(event.clientX - rect.left) * (canvas.width / rect.width), (event.clientY - rect.top) * (canvas.height / rect.height)];
}

// what a press at screen point (x, y) grabs: a corner or the body of the selected box
function grab(x, y) {
  const b = state.boxes[state.selected];
  if (!b) return null;
  const [x1, y1] = toScreen(b.box[0], b.box[1]);
  const [x2, y2] = toScreen(b.box[2], b.box[3]);
  const corners = [[x1, y1, "nw"], [x2, y1, "ne"], [x1, y2, "sw"], [x2, y2, "se"]];
  for (const [cx, cy, name] of corners) if (Math.abs(x - cx) <= HANDLE && Math.abs(y - cy) <= HANDLE) return name;
  return x >= x1 && x <= x2 && y >= y1 && y <= y2 ? "move" : null;
}

function boxAt(x, y) {
  let best = -1, bestArea = Infinity;
  state.boxes.forEach((b, i) => {
    if (!shown(b)) return;
    const [x1, y1] = toScreen(b.box[0], b.box[1]);
    const [x2, y2] = toScreen(b.box[2], b.box[3]);
    const area = (x2 - x1) * (y2 - y1);
    if (x >= x1 - 2 && x <= x2 + 2 && y >= y1 - 2 && y <= y2 + 2 && area < bestArea) { best = i; bestArea = area; }
  });
  return best;
}

$("canvas").addEventListener("mousedown", (event) => {
  if (!state.image) return;
  const [x, y] = canvasPoint(event);
  event.preventDefault();  // no text selection while dragging; leave the name field so shortcuts work
  if (document.activeElement && document.activeElement !== document.body) document.activeElement.blur();
  if (event.button === 1 || (event.button === 0 && state.space)) {
    state.drag = { mode: "pan", sx0: x, sy0: y, sx: x, sy: y, view: { ...state.view }, moved: false };
    return;
  }
  if (event.button !== 0) return;
  const part = grab(x, y);
  const b = state.boxes[state.selected];
  state.drag = { mode: part ? part : "draw", sx0: x, sy0: y, sx: x, sy: y, moved: false, start: b ? b.box.slice() : null };
});

function dragTo(d) {
  const dx = (d.sx - d.sx0) / state.view.s;
  const dy = (d.sy - d.sy0) / state.view.s;
  const b = state.boxes[state.selected];
  const [w, h] = imageSize();
  if (d.mode === "move") {
    const bw = d.start[2] - d.start[0], bh = d.start[3] - d.start[1];
    const x1 = Math.min(Math.max(d.start[0] + dx, 0), w - bw);
    const y1 = Math.min(Math.max(d.start[1] + dy, 0), h - bh);
    b.box = [x1, y1, x1 + bw, y1 + bh];
  } else {
    const box = d.start.slice();
    if (d.mode.includes("w")) box[0] += dx; else box[2] += dx;
    if (d.mode.includes("n")) box[1] += dy; else box[3] += dy;
    b.box = clip(box, [w, h]);
  }
}

window.addEventListener("mousemove", (event) => {
  const d = state.drag;
  if (!d) return;
  [d.sx, d.sy] = canvasPoint(event);
  if (!d.moved && Math.max(Math.abs(d.sx - d.sx0), Math.abs(d.sy - d.sy0)) < MIN_DRAG) return;
  if (!d.moved && d.mode !== "draw" && d.mode !== "pan") {
    snapshot();  // the box before the move
    const b = state.boxes[state.selected];
    b.source = "label";
    b.score = null;
  }
  d.moved = true;
  if (d.mode === "pan") state.view = { ...d.view, tx: d.view.tx + d.sx - d.sx0, ty: d.view.ty + d.sy - d.sy0, fit: false };
  else if (d.mode !== "draw") dragTo(d);
  draw();
});

window.addEventListener("mouseup", () => {
  const d = state.drag;
  if (!d) return;
  state.drag = null;
  if (d.mode === "pan") { draw(); return; }
  if (d.moved && d.mode !== "draw") { changed(); return; }  // moved or resized: the box is the operator's now
  if (d.moved) {
    const [ax, ay] = toImage(Math.min(d.sx0, d.sx), Math.min(d.sy0, d.sy));
    const [bx, by] = toImage(Math.max(d.sx0, d.sx), Math.max(d.sy0, d.sy));
    const box = clip([ax, ay, bx, by], imageSize());
    if (box[2] - box[0] >= 1 && box[3] - box[1] >= 1) {
      snapshot();
      state.boxes.push({ class_id: state.nextClass, box, score: null, source: "label" });
      state.selected = -1;  // one rule: the class keys are for the next box until a box is clicked
      changed();
      return;
    }
  }
  state.selected = boxAt(d.sx0, d.sy0);  // a click: the smallest shown box under the point, or none
  render();
});

$("canvas").addEventListener("wheel", (event) => {
  if (!state.image) return;
  event.preventDefault();
  const [x, y] = canvasPoint(event);
  zoomAt(Math.exp(-event.deltaY * 0.0015), x, y);
}, { passive: false });

$("canvas").addEventListener("auxclick", (event) => event.preventDefault());
// the stage's size follows the window and the page around it: the canvas follows, the view stays
// (a fitted view is fitted again: the header or the toolbar taking another line never leaves the image cut)
new ResizeObserver(() => { if (state.view.fit) fitView(); else sizeCanvas(); draw(); }).observe($("stage"));

// ------------------------------------------------------------------ keys and buttons
function onKey(event) {
  const key = event.key;
  if ((event.ctrlKey || event.metaKey) && !event.altKey && (key === "z" || key === "Z")) { undo(); return true; }
  if (event.ctrlKey || event.metaKey || event.altKey) return false;
  if (key === "a") decideAndNext("accept");
  else if (key === "c") decideAndNext("clean");
  else if (key === "s") decideAndNext("skip");
  else if (key === "n") step(1);
  else if (key === "p") step(-1);
  else if (/^[1-9]$/.test(key)) setClass(Number(key) - 1);
  else if (key === "Delete" || key === "Backspace") deleteSelected();
  else if (key === "Escape") { state.selected = -1; render(); }
  else if (key === "0") { fitView(); draw(); }
  else if (key === "v") nextView();
  else if (key === " ") { state.space = true; $("canvas").classList.add("panning"); }
  else return false;
  return true;
}

// next or previous image; not while a decision that moves on is being saved
function step(direction) {
  if (state.busy) return;
  const i = nextUsable(state.index, direction);
  if (i >= 0) show(i);
}

// the keys decide everywhere but in the text fields: on a filter dropdown a letter or digit is a shortcut (it
// never picks an option by its first letter; the arrow keys still change the filter)
document.addEventListener("keydown", (event) => {
  const target = event.target || {};
  const tag = target.tagName || "";
  if (tag === "INPUT" && !["range", "checkbox"].includes(target.type) || tag === "TEXTAREA") return;
  if (tag === "SELECT") {
    if (event.key.length !== 1 || event.key === " " || event.altKey) return;
    event.preventDefault();
    target.blur();
  }
  if (onKey(event)) event.preventDefault();
});

document.addEventListener("keyup", (event) => {
  if (event.key === " ") { state.space = false; $("canvas").classList.remove("panning"); }
});

$("classes").addEventListener("click", (event) => {
  const button = event.target.closest("button[data-class]");
  if (button) setClass(Number(button.dataset.class));
});

$("view-buttons").addEventListener("click", (event) => {
  const button = event.target.closest("button[data-plane]");
  if (button) showPlane(button.dataset.plane);
});

$("items").addEventListener("click", (event) => {
  const li = event.target.closest("li[data-index]");
  if (li) show(Number(li.dataset.index));
});

$("boxes").addEventListener("click", (event) => {
  const row = event.target.closest("tr[data-index]");
  if (row) { state.selected = Number(row.dataset.index); render(); }
});

$("min-score").addEventListener("input", () => {
  state.minScore = Number($("min-score").value);
  $("min-score-value").textContent = state.minScore.toFixed(3);
  if (state.selected >= 0 && !shown(state.boxes[state.selected])) state.selected = -1;
  render();
});

// a filter picked: the keys decide again (the dropdown lets go of them)
for (const id of ["filter-status", "filter-reason"]) $(id).addEventListener("change", () => { $(id).blur(); renderList(); });
// the decision buttons do what their keys do; a clicked button lets go of the focus (Enter never repeats it)
const BUTTONS = {
  "do-accept": () => decideAndNext("accept"), "do-clean": () => decideAndNext("clean"),
  "do-skip": () => decideAndNext("skip"), "do-next": () => step(1), "do-previous": () => step(-1),
  undo: undo, reset: resetImage,
};
for (const [id, action] of Object.entries(BUTTONS)) {
  $(id).addEventListener("click", (event) => { event.currentTarget.blur(); action(); });
}
$("zoom-reset").addEventListener("click", () => { fitView(); draw(); });
$("clear-proposals").addEventListener("click", clearProposals);
$("operator").addEventListener("change", () => localStorage.setItem(OPERATOR_KEY, $("operator").value.trim()));
$("operator").addEventListener("keydown", (event) => { if (event.key === "Enter") $("operator").blur(); });

async function download(url) {
  const response = await call(url);
  if (!response.ok) {
    let reason = response.statusText;
    try { reason = (await response.json()).error || reason; } catch (e) { /* not JSON */ }
    throw new Error(reason);
  }
  const disposition = response.headers.get("Content-Disposition") || "";
  const match = /filename="?([^";]+)"?/.exec(disposition);
  const link = document.createElement("a");
  link.href = URL.createObjectURL(await response.blob());
  link.download = match ? match[1] : "labels.zip";
  document.body.appendChild(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 60_000);
  return link.download;
}

$("export").addEventListener("click", async () => {
  await state.saving;
  const { ok, body } = await postJson("/v1/review/export", {});
  if (!ok) { setStatus("export failed: " + (body.error || "error"), true); return; }
  const left = body.problems.length ? ` (${body.problems.length} left out: ${body.problems[0]})` : "";
  try {
    const name = await download(body.download || "/v1/review/download");
    setStatus(`downloaded ${name}: ${body.images} images, ${body.annotations} boxes (also written: ${body.path})${left}`);
  } catch (error) {
    setStatus(`wrote ${body.path}, but the download failed: ${error.message}`, true);
  }
});


// ------------------------------------------------------------------ anomaly map (good-parts-only models)
// The served model's map of the image shown, under the boxes: transparent where the image looks like the good
// parts, yellow to red up to and above the threshold. Offered only when the live model is good-parts-only;
// fetched once per image while the layer is on (checkbox or m).
const anomalyMap = { available: false, on: true, name: null, image: null };

function drawAnomalyMap(context, ox, oy) {
  const item = state.items[state.index];
  if (!anomalyMap.available || !anomalyMap.on || !item || !state.image) return;
  if (anomalyMap.name !== item.name) { loadAnomalyMap(item.name); return; }
  if (!anomalyMap.image) return;
  context.save();
  context.imageSmoothingEnabled = true;  // the map is coarser than the image: smooth it
  context.drawImage(anomalyMap.image, ox, oy, state.image.width * state.view.s, state.image.height * state.view.s);
  context.restore();
}

async function loadAnomalyMap(name) {
  anomalyMap.name = name;
  anomalyMap.image = null;
  $("canvas").dataset.anomalyMap = "loading";
  const loaded = await fetchImage("/v1/review/map/" + encodeURIComponent(name));
  if (anomalyMap.name !== name) return;  // the operator moved on meanwhile
  anomalyMap.image = loaded.image;
  $("canvas").dataset.anomalyMap = loaded.image ? "shown" : "failed";
  if (!loaded.image) setStatus("anomaly map: " + loaded.error, true);
  draw();
}

function toggleAnomalyMap(on) {
  anomalyMap.on = on;
  $("show-map").checked = on;
  if (!on) $("canvas").dataset.anomalyMap = "off";
  else if (anomalyMap.image) $("canvas").dataset.anomalyMap = "shown";
  draw();
}

async function offerAnomalyMap() {
  const { ok, body } = await getJson("/v1/review/map");
  anomalyMap.available = ok && body.available === true;
  $("map-toggle").hidden = !anomalyMap.available;
  if (anomalyMap.available) draw();
}

$("show-map").addEventListener("change", (event) => toggleAnomalyMap(event.target.checked));
document.addEventListener("keydown", (event) => {
  const tag = (event.target && event.target.tagName) || "";
  if (tag === "INPUT" && event.target.type !== "range" && event.target.type !== "checkbox" || tag === "TEXTAREA" || tag === "SELECT") return;
  if (event.key === "m" && anomalyMap.available && !event.ctrlKey && !event.metaKey && !event.altKey) {
    toggleAnomalyMap(!anomalyMap.on);
    event.preventDefault();
  }
});
offerAnomalyMap();

loadFolder();
