// The playground calls the public API exactly as any client would, with the API key when one is given,
// and shows errors in the API's own words. No framework, no build step.
"use strict";

const keyInput = document.getElementById("api-key");
keyInput.value = localStorage.getItem("bert-api-key") || "";
keyInput.addEventListener("change", () => localStorage.setItem("bert-api-key", keyInput.value));

// The model the forms ask: "" is the server's default; with several models served, the picker sets another
// (its routes are under /models/NAME).
let modelPrefix = "";

async function call(path, body) {
  path = modelPrefix + path;
  const headers = { "content-type": "application/json" };
  if (keyInput.value) headers.authorization = "Bearer " + keyInput.value;
  const response = await fetch(path, body === undefined ? { headers } : { method: "POST", headers, body: JSON.stringify(body) });
  let payload = null;
  try { payload = await response.json(); } catch (_) { /* not JSON: reported below */ }
  if (!response.ok) {
    const message = payload && payload.error ? `${payload.error} (${payload.error_type})` : response.statusText;
    throw new Error(`${response.status}: ${message}`);
  }
  return payload;
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function barRow(label, value, shown) {
  const row = element("div", "bar-row");
  row.append(element("span", "bar-label", label));
  const track = element("div", "bar-track");
  const bar = element("div", "bar");
  bar.style.width = `${Math.max(0, Math.min(1, value)) * 100}%`;
  track.append(bar);
  row.append(track, element("span", "bar-value", shown));
  return row;
}

// Runs `work` for a form: disables its button, clears old results, shows the error if it fails.
function wire(formId, resultsId, work) {
  const form = document.getElementById(formId);
  const results = document.getElementById(resultsId);
  const error = form.parentElement.querySelector(".error");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = form.querySelector("button");
    button.disabled = true;
    error.hidden = true;
    results.replaceChildren();
    try {
      await work(results);
    } catch (failure) {
      error.textContent = failure.message;
      error.hidden = false;
    } finally {
      button.disabled = false;
    }
  });
}

wire("fill-form", "fill-results", async (results) => {
  const text = document.getElementById("fill-text").value;
  const topK = Number(document.getElementById("fill-k").value);
  const answer = await call("/fill-mask", { inputs: text, top_k: topK });
  const masks = answer.results[0].masks;
  masks.forEach((mask, index) => {
    if (masks.length > 1) results.append(element("div", "mask-title", `[MASK] ${index + 1}`));
    for (const p of mask.predictions) results.append(barRow(p.token_str, p.score, `${(p.score * 100).toFixed(1)}%`));
  });
});

wire("nsp-form", "nsp-results", async (results) => {
  const a = document.getElementById("nsp-a").value;
  const b = document.getElementById("nsp-b").value;
  const answer = await call("/nsp", { inputs: [a, b] });
  const score = answer.results[0].score;
  results.append(barRow("B follows A", score, `${(score * 100).toFixed(1)}%`));
  results.append(barRow("B is random", 1 - score, `${((1 - score) * 100).toFixed(1)}%`));
});

wire("sim-form", "sim-results", async (results) => {
  const sentences = document.getElementById("sim-text").value.split("\n").map((s) => s.trim()).filter(Boolean);
  const answer = await call("/encode", { inputs: sentences, pooling: "mean", normalize: true });
  const vectors = answer.results.map((r) => r.embedding);
  const table = element("table", "heatmap");
  const head = element("tr");
  head.append(element("th"));
  sentences.forEach((_, j) => head.append(element("th", null, `${j + 1}`)));
  table.append(head);
  vectors.forEach((u, i) => {
    const row = element("tr");
    row.append(element("th", null, `${i + 1}. ${sentences[i]}`));
    vectors.forEach((v) => {
      const cosine = u.reduce((sum, x, k) => sum + x * v[k], 0);
      const cell = element("td", null, cosine.toFixed(2));
      const strength = Math.max(0, Math.min(1, cosine));  // negative similarity shows as none
      cell.style.background = `hsl(215, 70%, ${96 - strength * 50}%)`;
      cell.style.color = strength > 0.6 ? "#fff" : "inherit";
      row.append(cell);
    });
    table.append(row);
  });
  results.append(table);
});

wire("rank-form", "rank-results", async (results) => {
  const query = document.getElementById("rank-query").value;
  const texts = document.getElementById("rank-texts").value.split("\n").map((s) => s.trim()).filter(Boolean);
  const ranks = await call("/rerank", { query, texts, return_text: true });
  for (const r of ranks) results.append(barRow(`${r.index + 1}. ${r.text}`, r.score, r.score.toFixed(3)));
});

wire("classify-form", "classify-results", async (results) => {
  const text = document.getElementById("classify-text").value;
  const labels = await call("/predict", { inputs: text });
  for (const l of labels) results.append(barRow(l.label, l.score, `${(l.score * 100).toFixed(1)}%`));
});

// Show what the served checkpoint can do: fill-mask and NSP need those heads; a cross-encoder ranks, a
// classifier classifies (model_type as text-embeddings-inference's /info says it).
function showHeads(info) {
  document.getElementById("model-name").textContent = info.model;
  showModels(info);
  document.getElementById("fill-mask").hidden = !info.heads.mlm;
  document.getElementById("nsp").hidden = !info.heads.nsp;
  document.getElementById("rank").hidden = !("reranker" in info.model_type);
  document.getElementById("classify").hidden = !("classifier" in info.model_type);
}

function loadInfo() {
  call("/info").then(showHeads)
    .catch(() => { document.getElementById("model-name").textContent = "(send the API key to see it)"; });
}
// Several models: a picker of every served model; choosing one points the forms at /models/NAME.
const picker = document.getElementById("model-picker");
function showModels(info) {
  const models = info.models || [];
  document.getElementById("model-choice").hidden = models.length < 2;
  if (picker.options.length === models.length) return;
  picker.replaceChildren(...models.map((m) => {
    const option = element("option", null, m.default ? `${m.name} (default)` : m.name);
    option.value = m.name;
    option.dataset.default = m.default ? "yes" : "";
    return option;
  }));
  picker.value = info.name;
}
picker.addEventListener("change", () => {
  const isDefault = picker.selectedOptions[0] && picker.selectedOptions[0].dataset.default === "yes";
  modelPrefix = isDefault ? "" : `/models/${encodeURIComponent(picker.value)}`;
  document.querySelectorAll(".results").forEach((results) => results.replaceChildren());
  loadInfo();
});

keyInput.addEventListener("change", loadInfo);
loadInfo();
