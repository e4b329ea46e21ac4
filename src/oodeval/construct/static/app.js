"use strict";
// oodeval construct annotation page: one queue at a time, evidence beside the image, keyboard first.

const $ = (sel) => document.querySelector(sel);
const state = { me: null, stage: 1, items: [], pos: 0, item: null, shortcutClasses: [], seq: 0 };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

async function api(path, options = {}) {
  const resp = await fetch(path, { credentials: "same-origin", ...options });
  const body = await resp.json().catch(() => ({ error: `HTTP ${resp.status}` }));
  if (!resp.ok) {
    const err = new Error(body.error || `HTTP ${resp.status}`);
    err.status = resp.status;
    throw err;
  }
  return body;
}

function say(text, cls = "ok") {
  const m = $("#message");
  m.textContent = text;
  m.className = cls;
}

function className(label) {
  const names = state.me.classes;
  return label === null || label === undefined ? "" : `${names[label] ?? label} (${label})`;
}

function renderProgress() {
  const body = $("#progress tbody");
  body.replaceChildren();
  for (const p of state.me.progress) {
    const s1 = p.role === "stage1" ? `${p.stage1_done}/${p.stage1_total}` : "–";
    body.append(el("tr", { "data-annotator": p.annotator },
      el("td", { text: p.annotator }), el("td", { text: s1 }), el("td", { text: `${p.stage3_done}/${p.stage3_total}` })));
  }
}

async function loadMe() {
  state.me = await api("/api/me");
  $("#who").textContent = `${state.me.name} (${state.me.role === "stage1" ? "Stage-1 annotator" : "Stage-3 annotator"})`;
  const select = $("#id-class");
  if (select.options.length === 1) {
    state.me.classes.forEach((name, i) => select.append(el("option", { value: String(i), text: `${i}: ${name}` })));
  }
  $("#tab-stage1").hidden = state.me.role !== "stage1";
  renderProgress();
}

async function loadQueue(stage, keepImage = null) {
  const seq = ++state.seq; // a later navigation wins over answers still in flight
  state.stage = stage;
  document.querySelectorAll("nav button").forEach((b) => b.classList.toggle("active", Number(b.dataset.stage) === stage));
  const q = await api(`/api/queue?stage=${stage}`);
  if (seq !== state.seq) return;
  state.items = q.items;
  let pos = state.items.findIndex((it) => it.image === keepImage);
  if (pos < 0) pos = state.items.findIndex((it) => !it.done);
  if (pos < 0) pos = 0;
  await show(pos, seq);
}

function section(title, ...content) {
  return el("section", {}, el("h4", { text: title }), ...content);
}

function classRow(entry, extra) {
  let at = state.shortcutClasses.indexOf(entry.label);
  if (at < 0 && state.shortcutClasses.length < 9) at = state.shortcutClasses.push(entry.label) - 1;
  const key = at >= 0 ? String(at + 1) : "";
  const thumbs = el("span", { class: "examples" });
  for (const url of state.item.examples[String(entry.label)] || []) thumbs.append(el("img", { src: url, alt: `example of ${entry.name}` }));
  return el("div", { class: "cls", "data-label": String(entry.label) },
    el("span", { class: "key", text: key }), `${entry.name} (${entry.label}) ${extra} `, thumbs);
}

function renderEvidence(item) {
  const ev = item.evidence || {};
  const box = $("#evidence");
  box.replaceChildren();
  state.shortcutClasses = [];
  box.append(section("(C) original label", classRow({ label: item.original_label, name: item.original_name }, `— flag: ${item.flag}`)));
  if (ev.mllm) {
    const m = ev.mllm;
    const verdict = m.in_list ? "one of the ID classes" : "not in the ID classes (open world)";
    box.append(section("(A) MLLM", el("div", { id: "mllm", text: `${m.label} — ${verdict}` }), el("div", { text: m.description || "" })));
  }
  if (ev.reverse_search && ev.reverse_search.length) {
    const links = el("div", { id: "reverse-search" });
    for (const r of ev.reverse_search) links.append(el("a", { href: r.url, target: "_blank", rel: "noopener noreferrer", text: r.service }), " ");
    box.append(section("(B) reverse image search", links));
  }
  if (ev.vlm_topk && ev.vlm_topk.length) {
    box.append(section("(D) closest ID classes (VLM)", ...ev.vlm_topk.map((e) => classRow(e, `cos ${e.cosine.toFixed(3)}`))));
  }
  if (ev.confusions && ev.confusions.length) {
    box.append(section("(E) classes reannotators chose for this label", ...ev.confusions.map((e) => classRow(e, `× ${e.count}`))));
  }
}

function renderStage3(item) {
  const panel = $("#stage3-panel");
  panel.hidden = !(state.stage === 3 && item.in_stage3);
  if (panel.hidden) return;
  const body = $("#stage3-table tbody");
  body.replaceChildren();
  for (const v of [...(item.stage1 || []), ...(item.stage3 || [])]) {
    body.append(el("tr", { class: `verdict-row stage${v.stage}` },
      el("td", { text: String(v.stage) }), el("td", { text: v.annotator }), el("td", { text: v.verdict }),
      el("td", { text: v.ood_label || "" }), el("td", { text: v.fine_grained ? "yes" : "" }), el("td", { text: className(v.id_class) })));
  }
  const o = item.outcome || {};
  $("#stage3-outcome").textContent = o.status === "final" ? `Decided: ${o.verdict}${o.ood_label ? " — " + o.ood_label : ""}` : "Waiting for all three Stage-3 verdicts (full consensus needed).";
}

function fillForm(v) {
  $("#verdict-form").reset();
  if (!v) return;
  $(`#v-${v.verdict}`).checked = true;
  $("#ood-label").value = v.ood_label || "";
  $("#fine-grained").checked = !!v.fine_grained;
  $("#id-class").value = v.id_class === null || v.id_class === undefined ? "" : String(v.id_class);
  $("#note").value = v.note || "";
}

async function show(pos, seq = ++state.seq) {
  state.pos = pos;
  const empty = state.items.length === 0;
  $("#empty").hidden = !empty;
  $("#item").hidden = empty;
  $("#position").textContent = empty ? "" : `Stage ${state.stage}: image ${pos + 1} of ${state.items.length} (${state.items.filter((i) => i.done).length} done)`;
  if (empty) return;
  const item = await api(`/api/item?image=${encodeURIComponent(state.items[pos].image)}`);
  if (seq !== state.seq) return;
  state.item = item;
  $("#image").src = item.image_url;
  $("#image").dataset.image = item.image;
  $("#meta").textContent = item.image;
  renderEvidence(item);
  renderStage3(item);
  const mine = state.stage === 1 ? item.my_stage1 : (item.stage3 || []).find((v) => v.annotator === state.me.name);
  fillForm(mine);
  $("#form-legend").textContent = state.stage === 1 ? "Your Stage-1 verdict (independent)" : "Your Stage-3 verdict (joint review)";
  $("#submit").disabled = state.stage === 3 && item.outcome && item.outcome.status === "final";
}

async function submit(event) {
  if (event) event.preventDefault();
  const checked = document.querySelector("input[name=verdict]:checked");
  if (!checked) return say("choose OOD (o), ID (i) or ambiguous (a) first", "error");
  const verdict = checked.value;
  const body = { image: state.item.image, stage: state.stage, verdict, note: $("#note").value || null };
  if (verdict === "ood") {
    body.ood_label = $("#ood-label").value;
    body.fine_grained = $("#fine-grained").checked;
  }
  if (verdict === "id") body.id_class = $("#id-class").value === "" ? null : Number($("#id-class").value);
  try {
    const res = await api("/api/verdict", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    await loadMe();
    await loadQueue(state.stage, null);
    const left = state.items.filter((i) => !i.done).length;
    say(`saved ${verdict} for ${res.image} (row ${res.row})` + (left ? "" : " — this queue is finished"));
  } catch (err) {
    say(err.message, "error");
  }
}

function chooseVerdict(v) {
  $(`#v-${v}`).checked = true;
  if (v !== "ood") $("#fine-grained").checked = false;
}

function onKey(event) {
  const t = event.target;
  const typing = t instanceof HTMLInputElement && t.type === "text" || t instanceof HTMLSelectElement || t instanceof HTMLTextAreaElement
    || (t instanceof HTMLInputElement && !["radio", "checkbox"].includes(t.type));
  if (event.key === "Escape") { t.blur && t.blur(); return; }
  if (event.key === "Enter" && t instanceof HTMLSelectElement && state.item) { event.preventDefault(); submit(); return; }
  if (typing || event.ctrlKey || event.metaKey || event.altKey || !state.item) return;
  const k = event.key;
  if (k === "o") { chooseVerdict("ood"); $("#ood-label").focus(); }
  else if (k === "i") { chooseVerdict("id"); $("#id-class").focus(); }
  else if (k === "a") chooseVerdict("ambiguous");
  else if (k === "f") { chooseVerdict("ood"); $("#fine-grained").checked = !$("#fine-grained").checked; }
  else if (/^[1-9]$/.test(k) && state.shortcutClasses[Number(k) - 1] !== undefined) {
    chooseVerdict("id");
    $("#id-class").value = String(state.shortcutClasses[Number(k) - 1]);
  }
  else if (k === "Enter") submit();
  else if ((k === "n" || k === "ArrowRight") && state.pos + 1 < state.items.length) show(state.pos + 1);
  else if ((k === "p" || k === "ArrowLeft") && state.pos > 0) show(state.pos - 1);
  else return;
  event.preventDefault();
}

async function main() {
  try {
    await loadMe();
  } catch (err) {
    $("#login").hidden = false;
    if (err.status !== 401) $("#login-error").textContent = err.message;
    return;
  }
  $("#app").hidden = false;
  document.querySelectorAll("nav button").forEach((b) => b.addEventListener("click", () => loadQueue(Number(b.dataset.stage))));
  $("#verdict-form").addEventListener("submit", submit);
  document.addEventListener("keydown", onKey);
  await loadQueue(state.me.role === "stage1" ? 1 : 3);
}

main();
