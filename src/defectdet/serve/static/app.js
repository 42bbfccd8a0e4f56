// defectdet inspection page: plain JS, no build step, no network beyond this service.
"use strict";

const $ = (id) => document.getElementById(id);
const BOX_COLOR = "rgb(255, 32, 32)";
let drawnBoxes = 0;

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// With `serve --token-file`, the API wants `Authorization: Bearer <token>`: asked once, kept for this tab.
const TOKEN_KEY = "defectdet-token";
let tokenAsked = false;  // one prompt per page load, not one per refresh

function withToken(options) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = new Headers((options && options.headers) || {});
  if (token) headers.set("Authorization", "Bearer " + token);
  return { ...(options || {}), headers };
}

async function getJson(url, options) {
  const sent = sessionStorage.getItem(TOKEN_KEY);
  let response = await fetch(url, withToken(options));
  if (response.status === 401) {
    if (sessionStorage.getItem(TOKEN_KEY) === sent && !tokenAsked) {
      tokenAsked = true;
      const token = window.prompt("This service needs its access token (serve --token-file):");
      if (token) { sessionStorage.setItem(TOKEN_KEY, token.trim()); tokenAsked = false; }
    }
    if (sessionStorage.getItem(TOKEN_KEY) !== sent) response = await fetch(url, withToken(options));
  }
  let body = null;
  try { body = await response.json(); } catch (e) { body = { error: response.statusText }; }
  return { ok: response.ok, status: response.status, body };
}

async function loadModel() {
  const { ok, body } = await getJson("/v1/model");
  if (!ok) { $("model").textContent = "model: " + (body.error || "unavailable"); return; }
  const warning = body.quality && body.quality.warning;  // a model with a near-zero validation mAP
  $("model-warning").hidden = !warning;
  $("model-warning").textContent = warning ? "Warning: " + warning : "";
  const meta = body.metadata;
  $("model").textContent = `model ${body.model_version} · ${meta.preset || "?"} · ${meta.input_size}px · ` +
    `classes: ${meta.class_names.join(", ")} · threshold ${meta.thresholds.threshold.toFixed(3)}`;
  $("template-label").style.display = meta.template ? "" : "none";
  $("template").required = !!meta.template;
  // one file field per companion capture the model takes, named as the capture (as /v1/detect wants it)
  $("companions").innerHTML = (meta.companions || []).map((name) =>
    `<label>${escapeHtml(name)} <input type="file" class="companion" data-plane="${escapeHtml(name)}" accept="image/*" required></label>`
  ).join("");
}

async function refreshReady() {
  const { ok, body } = await getJson("/readyz");
  $("ready").textContent = ok ? "ready" : ("not ready: " + (body.reason || body.error || ""));
  $("ready").className = "badge " + (ok ? "ok" : "warn");
}

function loadImage(file) {
  return new Promise((resolve) => {
    const url = URL.createObjectURL(file);
    const image = new Image();
    image.onload = () => resolve({ image, url });
    image.onerror = () => resolve({ image: null, url });
    image.src = url;
  });
}

function drawResult(image, result) {
  const canvas = $("canvas");
  const [width, height] = result.image_size;
  const scale = Math.min(1, 640 / width, 640 / height);
  canvas.width = Math.max(1, Math.round(width * scale));
  canvas.height = Math.max(1, Math.round(height * scale));
  const context = canvas.getContext("2d");
  context.fillStyle = "#333";
  context.fillRect(0, 0, canvas.width, canvas.height);
  if (image) context.drawImage(image, 0, 0, canvas.width, canvas.height);
  context.lineWidth = 2;
  context.font = "12px system-ui, sans-serif";
  drawnBoxes = 0;
  for (const detection of result.detections) {
    const [x1, y1, x2, y2] = detection.box.map((v) => v * scale);
    context.strokeStyle = BOX_COLOR;
    context.strokeRect(x1, y1, Math.max(1, x2 - x1), Math.max(1, y2 - y1));
    const label = `${detection.class_name} ${detection.score.toFixed(2)}`;
    const textWidth = context.measureText(label).width + 6;
    const top = y1 > 16 ? y1 - 16 : y2;
    context.fillStyle = BOX_COLOR;
    context.fillRect(x1, top, textWidth, 16);
    context.fillStyle = "#fff";
    context.fillText(label, x1 + 3, top + 12);
    drawnBoxes += 1;
  }
  canvas.dataset.boxes = String(drawnBoxes);
}

function showResult(result) {
  const verdict = $("verdict");
  verdict.textContent = `${result.verdict} · ${result.detections.length} detection(s) at ≥ ${result.threshold.toFixed(3)}`;
  verdict.className = "verdict " + result.verdict;
  $("detections").querySelector("tbody").innerHTML = result.detections.map((d) =>
    `<tr><td>${escapeHtml(d.class_name)}</td><td>${d.score.toFixed(3)}</td><td>${d.box.map((v) => v.toFixed(1)).join(", ")}</td></tr>`
  ).join("");
  const t = result.timings_ms;
  $("timings").textContent = `total ${t.total.toFixed(1)} ms (queue ${t.queue.toFixed(1)}, decode ${t.decode.toFixed(1)}, ` +
    `model ${t.model.toFixed(1)}, postprocess ${t.postprocess.toFixed(1)}) · model ${result.model_version}`;
}

async function inspect(event) {
  event.preventDefault();
  const file = $("image").files[0];
  if (!file) { $("status").textContent = "choose an image first"; return; }
  const form = new FormData();
  form.append("image", file);
  const template = $("template").files[0];
  if (template && $("template-label").style.display !== "none") form.append("template", template);
  for (const input of $("companions").querySelectorAll("input.companion")) {
    if (input.files[0]) form.append(input.dataset.plane, input.files[0]);
  }
  if ($("threshold").value !== "") form.append("threshold", $("threshold").value);
  $("status").textContent = "inspecting…";
  $("submit").disabled = true;
  try {
    const [{ ok, status, body }, loaded] = await Promise.all([getJson("/v1/detect", { method: "POST", body: form }), loadImage(file)]);
    if (!ok) {
      $("status").textContent = `refused (${status}): ${body.error || JSON.stringify(body)}`;
      return;
    }
    drawResult(loaded.image, body);
    URL.revokeObjectURL(loaded.url);
    showResult(body);
    $("status").textContent = loaded.image ? "done" : "done (the browser cannot display this image format; boxes on a blank canvas)";
    refreshDrift();
    refreshResults();
  } catch (error) {
    $("status").textContent = "request failed: " + error;
  } finally {
    $("submit").disabled = false;
  }
}

function chartSvg(name, values, limits, level) {
  const width = 220, height = 64, pad = 2;
  const alert = limits.alert_limit, warn = limits.warn_limit;
  const top = Math.max(alert * 1.4, ...values.map((v) => Math.abs(v)));
  const bottom = limits.two_sided ? -top : -0.15 * top;
  const y = (v) => pad + (height - 2 * pad) * (top - v) / (top - bottom);
  const x = (i) => values.length <= 1 ? width - pad : pad + (width - 2 * pad) * i / (values.length - 1);
  const line = (v, color, dash) => `<line x1="0" x2="${width}" y1="${y(v).toFixed(1)}" y2="${y(v).toFixed(1)}" stroke="${color}" stroke-dasharray="${dash}"/>`;
  let guides = line(0, "#99a", "2 2") + line(alert, "#c62828", "4 2") + line(warn, "#ef8f00", "2 3");
  if (limits.two_sided) guides += line(-alert, "#c62828", "4 2") + line(-warn, "#ef8f00", "2 3");
  const points = values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
  const color = level === "alert" ? "#c62828" : level === "warn" ? "#ef8f00" : "#1d4ed8";
  return `<div class="chart" data-chart="${escapeHtml(name)}"><div class="name">${escapeHtml(name)}</div>` +
    `<svg width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">${guides}` +
    (values.length ? `<polyline fill="none" stroke="${color}" stroke-width="1.5" points="${points}"/>` : "") + `</svg></div>`;
}

async function refreshDrift() {
  const { ok, body } = await getJson("/v1/drift");
  if (!ok) return;
  const state = body.state;
  $("drift-level").textContent = state.level;
  $("drift-level").className = "badge " + state.level;
  const skipped = Object.entries(body.skipped || {}).map(([name, why]) => ` · ${name} not charted: ${why}`).join("");
  $("drift-message").textContent = state.message + skipped;
  $("drift-charts").innerHTML = Object.entries(body.limits).map(([name, limits]) => {
    const chart = state.charts[name] || { level: "ok", value: NaN };
    const values = body.history.map((point) => point[name]).filter((v) => Number.isFinite(v));
    const title = `${name} ${Number.isFinite(chart.value) ? chart.value.toPrecision(4) : "–"} (${chart.level})`;
    return chartSvg(title, values, limits, chart.level);
  }).join("");
}

async function refreshResults() {
  const { ok, body } = await getJson("/v1/results");
  if (!ok) return;
  $("results").querySelector("tbody").innerHTML = body.results.map((r) =>
    `<tr><td>${new Date(r.time * 1000).toLocaleTimeString()}</td><td><span class="badge ${r.verdict}">${r.verdict}</span></td>` +
    `<td>${r.detections}</td><td>${escapeHtml(r.classes.join(", "))}</td><td>${r.top_score.toFixed(3)}</td>` +
    `<td><span class="badge ${r.drift}">${r.drift}</span></td><td>${r.total_ms}</td></tr>`
  ).join("");
}

// The models panel (serve --models-dir): live, shadow and previous, and the changes; hidden without a models folder.
let liveVersion = null;

async function refreshModels() {
  const { ok, body } = await getJson("/v1/models");
  if (!ok || !body.models_dir) { $("models-panel").hidden = true; return; }
  $("models-panel").hidden = false;
  if (liveVersion !== null && liveVersion !== body.live.model_version) loadModel();  // promoted or rolled back
  liveVersion = body.live.model_version;
  const flag = (m) => m.quality && m.quality.near_zero ?
    ` <span class="badge alert" title="${escapeHtml(m.quality.warning)}">validation ${escapeHtml(m.quality.metric)} ${m.quality.value.toFixed(4)}: near zero</span>` : "";
  const row = (role, m) => m ? `<tr><td>${role}</td><td>${escapeHtml(m.name)}${flag(m)}</td><td>${escapeHtml(m.model_version || "")}</td>` +
    `<td>${escapeHtml(m.since || m.file || "")}</td><td>${m.threshold === undefined ? "" : m.threshold.toFixed(3)}</td></tr>` : "";
  const store = body.store, served = body.live.generation;
  const liveRole = served == null ? "live" : `live, generation ${served}` +
    (store && store.generation !== served ? ` (store: ${store.generation}, loading)` : "");
  $("models").querySelector("tbody").innerHTML = row(liveRole, body.live) + row("shadow", body.shadow) + row("previous", body.previous);
  const shadow = body.shadow;
  const rate = shadow && shadow.disagreement_rate !== null ? shadow.disagreement_rate : null;
  $("shadow-rate").textContent = shadow ? (rate === null ? "shadow: no images yet" : `disagree ${(100 * rate).toFixed(1)}%`) : "no shadow";
  $("shadow-rate").className = "badge " + (!shadow || rate === null ? "unknown" : rate > 0.05 ? "warn" : "ok");
  $("shadow-summary").textContent = shadow ? `${shadow.images} images compared, ${shadow.disagreements.verdict || 0} verdicts and ` +
    `${shadow.disagreements.boxes || 0} box sets differ, ${shadow.skipped_busy} skipped (shadow busy), ${shadow.errors} errors; ` +
    (shadow.compare ? `compare says ${shadow.compare.decision} (${shadow.compare.file})` : "no compare verdict on this pair (promoting asks to force)") : "";
  const chosen = $("candidate").value;
  $("candidate").innerHTML = body.candidates.map((c) => `<option>${escapeHtml(c.name)}</option>`).join("");
  if (body.candidates.some((c) => c.name === chosen)) $("candidate").value = chosen;
  $("promote").disabled = !shadow;
  $("shadow-stop").disabled = !shadow;
  $("rollback").disabled = !body.previous;
}

// who changes the models, recorded in promotions.jsonl: the name typed on the review page (same browser), else asked
function operatorName() {
  const known = (localStorage.getItem("defectdet-operator") || "").trim();
  if (known) return known;
  const typed = (window.prompt("Your name (recorded with the change):") || "").trim();
  if (typed) localStorage.setItem("defectdet-operator", typed);
  return typed;
}

async function changeModels(route, payload, question) {
  if (question && !window.confirm(question)) return;
  const by = operatorName();
  if (!by) { $("models-status").textContent = "type your name to change the models (it is recorded)"; return; }
  const post = (data) => getJson(route, { method: "POST", body: JSON.stringify({ ...data, by }),
    headers: { "Content-Type": "application/json", "X-Defectdet-Request": "1" } });
  let { ok, body } = await post(payload);
  if (!ok && body && (body.error || "").includes("force: true")
      && window.confirm(`${body.error.split("; to promote anyway")[0]}.\n\nPromote anyway?`)) {
    ({ ok, body } = await post({ ...payload, force: true }));
  }
  $("models-status").textContent = ok ? (body.done ? `${body.done.action}: ${body.done.to.name} is live` : "done") : (body.error || "failed");
  refreshModels();
}

$("shadow-form").addEventListener("submit", (event) => { event.preventDefault();
  changeModels("/v1/models/shadow", { bundle: $("candidate").value }); });
$("shadow-stop").addEventListener("click", () => changeModels("/v1/models/shadow", { bundle: null }));
$("promote").addEventListener("click", () => changeModels("/v1/models/promote", {}, "Make the shadow the live model?"));
$("rollback").addEventListener("click", () => changeModels("/v1/models/rollback", {}, "Bring the previous model back?"));
$("detect-form").addEventListener("submit", inspect);
$("drift-reset").addEventListener("click", async () => { await getJson("/v1/drift/reset", { method: "POST", body: "{}",
  headers: { "Content-Type": "application/json", "X-Defectdet-Request": "1" } }); refreshDrift(); });
loadModel();
refreshReady();
refreshDrift();
refreshResults();
refreshModels();
setInterval(() => { refreshReady(); refreshDrift(); refreshResults(); refreshModels(); }, 3000);
