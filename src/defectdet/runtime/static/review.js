// defectdet review page: plain JS, no build step, no network beyond this service.
// Every decision is POSTed at once (with the token, X-Defectdet-Request and a JSON body) and saved as labels.
"use strict";

const $ = (id) => document.getElementById(id);
const COLORS = ["#e53935", "#1e88e5", "#43a047", "#fb8c00", "#8e24aa", "#00acc1", "#6d4c41", "#c0ca33", "#ec407a"];
const MAX_SIDE = 760;
// Small images (200 px steel strips, tile crops) are enlarged up to this factor so boxes can be drawn on them.
const MAX_ENLARGE = 4;
const TOKEN_KEY = "defectdet-token";
const OPERATOR_KEY = "defectdet-operator";
let tokenAsked = false;

const state = {
  items: [], classNames: [], index: -1, boxes: [], selected: -1, currentClass: 0,
  image: null, scale: 1, drag: null, saved: 0, broken: new Set(),
};

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

// ------------------------------------------------------------------ the list
async function loadFolder() {
  const { ok, body } = await getJson("/v1/review/items");
  if (!ok) { setStatus("cannot list the folder: " + (body.error || "error"), true); return; }
  state.items = body.items;
  state.classNames = body.class_names;
  $("folder").textContent = "folder " + body.folder;
  if (!$("operator").value) $("operator").value = localStorage.getItem(OPERATOR_KEY) || body.operator || "";
  for (const item of state.items) if (item.error) state.broken.add(item.name);
  renderClasses();
  renderList();
  const first = state.items.findIndex((item) => !item.error && (item.status === "pending" || item.status === "labelled"));
  await show(first >= 0 ? first : nextUsable(-1, 1));
  if (!state.items.length) setStatus("no images in this folder");
}

function renderCounts() {
  const counts = {};
  for (const item of state.items) {
    if (!state.broken.has(item.name)) counts[item.status] = (counts[item.status] || 0) + 1;
  }
  const parts = Object.entries(counts).map(([k, v]) => `${v} ${k}`);
  $("counts").textContent = `${state.items.length} images · ${parts.join(" · ")} · broken: ${state.broken.size}`;
  $("counts").dataset.broken = String(state.broken.size);
}

function renderList() {
  $("items").innerHTML = state.items.map((item, i) => {
    const broken = state.broken.has(item.name);
    const label = broken ? "error" : item.status;
    return `<li data-index="${i}" class="${i === state.index ? "current" : ""} ${broken ? "error" : ""}" ` +
      `title="${escapeHtml(item.error || item.label_error || "")}"><span>${escapeHtml(item.name)}</span>` +
      `<span class="state">${escapeHtml(label)}</span></li>`;
  }).join("");
  renderCounts();
}

function renderClasses() {
  $("classes").innerHTML = state.classNames.map((name, i) =>
    `<button type="button" data-class="${i}" class="${i === state.currentClass ? "current" : ""}">` +
    `${i < 9 ? i + 1 + " " : ""}${escapeHtml(name)}</button>`).join("");
}

function nextUsable(from, step) {
  for (let i = from + step; i >= 0 && i < state.items.length; i += step) {
    if (!state.broken.has(state.items[i].name)) return i;
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

async function show(index) {
  if (index < 0 || index >= state.items.length) return;
  state.index = index;
  const item = state.items[index];
  state.boxes = item.boxes.map((b) => ({ class_id: b.class_id, box: b.box.slice(), score: b.score }));
  state.selected = -1;
  $("item-name").textContent = item.name;
  $("item-status").textContent = item.status;
  $("item-status").className = "badge " + item.status;
  const info = [];
  if (item.verdict) info.push("model: " + item.verdict);
  if (item.reasons && item.reasons.length) info.push("kept: " + item.reasons.join(", "));
  if (item.operator) info.push(`decided by ${item.operator} ${item.decided || ""}`);
  $("item-info").textContent = info.join(" · ");
  $("label-error").hidden = !item.label_error;
  $("label-error").textContent = item.label_error
    ? item.label_error + " — the file is kept as it is until you decide (showing the model's boxes)" : "";
  renderList();
  const loaded = item.error ? { image: null, error: item.error } : await fetchImage("/v1/review/image/" + encodeURIComponent(item.name));
  if (state.index !== index) return;  // the operator moved on meanwhile
  if (!loaded.image) {
    markBroken(item, loaded.error);
    return;
  }
  $("item-error").hidden = true;
  state.image = loaded.image;
  draw();
  const template = $("template");
  template.hidden = true;
  if (item.template) {
    const t = await fetchImage("/v1/review/template/" + encodeURIComponent(item.name));
    if (t.image && state.index === index) {
      template.width = Math.round(t.image.width * state.scale);
      template.height = Math.round(t.image.height * state.scale);
      const templateContext = template.getContext("2d");
      templateContext.imageSmoothingEnabled = state.scale < 1;
      templateContext.drawImage(t.image, 0, 0, template.width, template.height);
      template.hidden = false;
    }
  }
  setStatus(`${index + 1} / ${state.items.length}`);
}

function markBroken(item, reason) {
  state.broken.add(item.name);
  item.error = reason;
  state.image = null;
  $("item-error").hidden = false;
  $("item-error").textContent = `${item.name}: ${reason} (skipped)`;
  const canvas = $("canvas");
  canvas.dataset.boxes = "0";
  canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
  renderList();
  setStatus(`${item.name} cannot be shown: skipped`, true);
}

function draw() {
  const canvas = $("canvas");
  const image = state.image;
  if (!image) return;
  state.scale = Math.min(MAX_ENLARGE, MAX_SIDE / image.width, MAX_SIDE / image.height);
  canvas.width = Math.max(1, Math.round(image.width * state.scale));
  canvas.height = Math.max(1, Math.round(image.height * state.scale));
  const context = canvas.getContext("2d");
  context.imageSmoothingEnabled = state.scale < 1; // enlarged pixels stay sharp: a thin scratch is not blurred
  context.drawImage(image, 0, 0, canvas.width, canvas.height);
  context.font = "12px system-ui, sans-serif";
  state.boxes.forEach((b, i) => {
    const [x1, y1, x2, y2] = b.box.map((v) => v * state.scale);
    context.strokeStyle = COLORS[b.class_id % COLORS.length];
    context.lineWidth = i === state.selected ? 4 : 2;
    context.setLineDash(i === state.selected ? [6, 3] : []);
    context.strokeRect(x1, y1, x2 - x1, y2 - y1);
    context.setLineDash([]);
    context.fillStyle = context.strokeStyle;
    context.fillText(`${i + 1} ${state.classNames[b.class_id] || b.class_id}`, x1 + 2, Math.max(11, y1 - 3));
  });
  if (state.drag && state.drag.moved) {
    const d = state.drag;
    context.strokeStyle = "#ffeb3b";
    context.lineWidth = 2;
    context.strokeRect(Math.min(d.x0, d.x1), Math.min(d.y0, d.y1), Math.abs(d.x1 - d.x0), Math.abs(d.y1 - d.y0));
  }
  canvas.dataset.boxes = String(state.boxes.length);
  $("boxes").querySelector("tbody").innerHTML = state.boxes.map((b, i) =>
    `<tr class="${i === state.selected ? "selected" : ""}"><td>${i + 1}</td>` +
    `<td>${escapeHtml(state.classNames[b.class_id] || b.class_id)}</td>` +
    `<td>${b.score == null ? "operator" : Number(b.score).toFixed(3)}</td>` +
    `<td>${b.box.map((v) => Math.round(v)).join(", ")}</td></tr>`).join("");
}

// ------------------------------------------------------------------ decisions
async function decide(action) {
  const item = state.items[state.index];
  if (!item) return false;
  if (state.broken.has(item.name) && action !== "skip") { setStatus("a broken image can only be skipped", true); return false; }
  const operator = $("operator").value.trim();
  if (!operator) { setStatus("type your name in the Operator field first", true); $("operator").focus(); return false; }
  localStorage.setItem(OPERATOR_KEY, operator);
  const boxes = state.boxes.map((b) => ({ class_id: b.class_id, box: b.box }));
  const { ok, body } = await postJson("/v1/review/decide", { image: item.name, action, boxes, operator });
  if (!ok) { setStatus(`not saved: ${body.error || "error"}`, true); return false; }
  const index = state.items.indexOf(item);
  if (index >= 0) state.items[index] = body;
  state.saved += 1;
  document.body.dataset.saved = String(state.saved);
  setStatus(`saved: ${item.name} ${action} (${boxes.length} box${boxes.length === 1 ? "" : "es"})`);
  renderList();
  $("item-status").textContent = body.status;
  $("item-status").className = "badge " + body.status;
  return true;
}

async function decideAndNext(action) {
  if (await decide(action)) {
    const next = nextUsable(state.index, 1);
    if (next >= 0) await show(next); else setStatus("saved; that was the last image", false);
  }
}

function setClass(classId) {
  if (classId >= state.classNames.length) return;
  state.currentClass = classId;
  renderClasses();
  if (state.selected >= 0) {
    state.boxes[state.selected].class_id = classId;
    state.boxes[state.selected].score = null;
    draw();
    decide("edit");
  }
}

function deleteSelected() {
  if (state.selected < 0) return;
  state.boxes.splice(state.selected, 1);
  state.selected = -1;
  draw();
  decide("edit");
}

// ------------------------------------------------------------------ mouse
function canvasPoint(event) {
  const rect = $("canvas").getBoundingClientRect();
  const canvas = $("canvas");
  return {
    x: (event.clientX - rect.left) * (canvas.width / rect.width),
    y: (event.clientY - rect.top) * (canvas.height / rect.height),
  };
}

$("canvas").addEventListener("mousedown", (event) => {
  if (!state.image || event.button !== 0) return;
  const p = canvasPoint(event);
  state.drag = { x0: p.x, y0: p.y, x1: p.x, y1: p.y, moved: false };
  event.preventDefault();  // no text selection while dragging; leave the name field so shortcuts work
  if (document.activeElement && document.activeElement !== document.body) document.activeElement.blur();
});

window.addEventListener("mousemove", (event) => {
  if (!state.drag) return;
  const p = canvasPoint(event);
  const canvas = $("canvas");
  state.drag.x1 = Math.min(Math.max(p.x, 0), canvas.width);
  state.drag.y1 = Math.min(Math.max(p.y, 0), canvas.height);
  if (Math.abs(state.drag.x1 - state.drag.x0) > 3 || Math.abs(state.drag.y1 - state.drag.y0) > 3) state.drag.moved = true;
  draw();
});

window.addEventListener("mouseup", () => {
  const d = state.drag;
  if (!d) return;
  state.drag = null;
  const s = state.scale;
  if (d.moved) {
    const box = [Math.min(d.x0, d.x1) / s, Math.min(d.y0, d.y1) / s, Math.max(d.x0, d.x1) / s, Math.max(d.y0, d.y1) / s];
    state.boxes.push({ class_id: state.currentClass, box, score: null });
    state.selected = state.boxes.length - 1;
    draw();
    decide("edit");
    return;
  }
  // a click: select the smallest box under the point
  let best = -1, bestArea = Infinity;
  state.boxes.forEach((b, i) => {
    const [x1, y1, x2, y2] = b.box.map((v) => v * s);
    const area = (x2 - x1) * (y2 - y1);
    if (d.x0 >= x1 && d.x0 <= x2 && d.y0 >= y1 && d.y0 <= y2 && area < bestArea) { best = i; bestArea = area; }
  });
  state.selected = best;
  draw();
});

// ------------------------------------------------------------------ keys and buttons
document.addEventListener("keydown", (event) => {
  const tag = (event.target && event.target.tagName) || "";
  if (tag === "INPUT" || tag === "TEXTAREA" || event.ctrlKey || event.metaKey || event.altKey) return;
  const key = event.key;
  if (key === "a") decideAndNext("accept");
  else if (key === "c") decideAndNext("clean");
  else if (key === "s") decideAndNext("skip");
  else if (key === "n") { const i = nextUsable(state.index, 1); if (i >= 0) show(i); }
  else if (key === "p") { const i = nextUsable(state.index, -1); if (i >= 0) show(i); }
  else if (/^[1-9]$/.test(key)) setClass(Number(key) - 1);
  else if (key === "Delete" || key === "Backspace") deleteSelected();
  else if (key === "Escape") { state.selected = -1; draw(); }
  else return;
  event.preventDefault();
});

$("classes").addEventListener("click", (event) => {
  const button = event.target.closest("button[data-class]");
  if (button) setClass(Number(button.dataset.class));
});

$("items").addEventListener("click", (event) => {
  const li = event.target.closest("li[data-index]");
  if (li) show(Number(li.dataset.index));
});

$("operator").addEventListener("change", () => localStorage.setItem(OPERATOR_KEY, $("operator").value.trim()));
$("operator").addEventListener("keydown", (event) => { if (event.key === "Enter") $("operator").blur(); });

$("export").addEventListener("click", async () => {
  const { ok, body } = await postJson("/v1/review/export", {});
  if (!ok) { setStatus("export failed: " + (body.error || "error"), true); return; }
  const left = body.problems.length ? ` (${body.problems.length} left out: ${body.problems[0]})` : "";
  setStatus(`wrote ${body.path}: ${body.images} images, ${body.annotations} boxes${left}`);
});

loadFolder();
