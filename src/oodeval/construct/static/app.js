"use strict";
// oodeval construct annotation page: one queue at a time, evidence beside the image, keyboard first.
// Enter acts only inside the verdict form; every submission carries a fresh id and the row it revises.
// Every API call carries this browser's binding (kept in this origin's localStorage, which no other
// origin can read or set): a session cookie planted by another site does not match it.

const $ = (sel) => document.querySelector(sel);
const state = { me: null, stage: 1, items: [], pos: 0, item: null, shortcutClasses: [], seq: 0, busy: false, done: false };
const POLL_MS = 3000; // new Stage-3 images and progress appear without a reload
const FIELD_NAMES = { verdict: "verdict", ood_label: "OOD label", fine_grained: "fine-grained flag", id_class: "ID class" };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function randomHex(n) {
  return Array.from(crypto.getRandomValues(new Uint8Array(n)), (b) => b.toString(16).padStart(2, "0")).join("");
}

function binding() {
  let b = localStorage.getItem("oodeval-binding");
  if (!b) {
    b = randomHex(24);
    localStorage.setItem("oodeval-binding", b);
  }
  return b;
}

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}), "X-Oodeval-Binding": binding() };
  const resp = await fetch(path, { credentials: "same-origin", ...options, headers });
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

function submissionId() {
  return randomHex(16);
}

function mine(p) {
  return p.annotator === state.me.name;
}

function renderProgress() {
  const body = $("#progress tbody");
  body.replaceChildren();
  for (const p of state.me.progress) {
    const s1 = p.role === "stage1" ? `${p.stage1_done}/${p.stage1_total}` : "–";
    body.append(el("tr", { "data-annotator": p.annotator },
      el("td", { text: p.annotator }), el("td", { text: s1 }), el("td", { text: `${p.stage3_done}/${p.stage3_total}` })));
  }
  const me = state.me.progress.find(mine);
  const waiting = me ? me.stage3_waiting : 0;
  $("#waiting").textContent = waiting ? `${waiting} image${waiting > 1 ? "s" : ""} wait for you in Stage 3 (press s)` : "";
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
  $("#new-items").textContent = "";
  let pos = state.items.findIndex((it) => it.image === keepImage);
  if (pos < 0) pos = state.items.findIndex((it) => !it.done);
  if (pos < 0 && state.items.length) return showDone();
  await show(Math.max(pos, 0), seq);
}

function positionText() {
  const n = state.items.length;
  const done = state.items.filter((i) => i.done).length;
  if (!n) return `Stage ${state.stage}`;
  return state.done ? `Stage ${state.stage}: all ${n} done` : `Stage ${state.stage}: image ${state.pos + 1} of ${n} (${done} done)`;
}

function showDone() {
  ++state.seq;
  state.done = true;
  state.item = null;
  $("#item").hidden = true;
  $("#empty").hidden = true;
  $("#done").hidden = false;
  const n = state.items.length;
  $("#done-title").textContent = `Stage ${state.stage} done`;
  const me = state.me.progress.find(mine);
  const waiting = me && state.stage === 1 && me.stage3_waiting ? ` ${me.stage3_waiting} image(s) wait for you in Stage 3 (press s).` : "";
  $("#done-text").textContent = `You have given a verdict on all ${n} image${n > 1 ? "s" : ""} of this queue.${waiting}`;
  $("#position").textContent = positionText();
}

async function poll() {
  // progress, and new images in the open queue, without disturbing what is being typed
  if (state.busy || !state.me) return;
  try {
    await loadMe();
    const seq = state.seq;
    const q = await api(`/api/queue?stage=${state.stage}`);
    if (seq !== state.seq || state.busy) return;
    const known = new Set(state.items.map((it) => it.image));
    const added = q.items.filter((it) => !known.has(it.image));
    const current = state.item ? state.item.image : null;
    state.items = q.items;
    if (added.length) $("#new-items").textContent = `${added.length} new image${added.length > 1 ? "s" : ""} in this queue`;
    if (!current && added.length) {
      state.done = false;
      await show(state.items.findIndex((it) => !it.done) >= 0 ? state.items.findIndex((it) => !it.done) : 0);
      return;
    }
    const pos = state.items.findIndex((it) => it.image === current);
    if (pos >= 0) state.pos = pos;
    $("#position").textContent = positionText();
  } catch (err) {
    if (err.status === 401) say("your session ended (logged out, expired or the token was reissued): reload the page and log in", "error");
  }
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

function describeState(item) {
  const o = item.outcome;
  if (item.status === "final" && o) {
    const what = o.verdict === "ood" ? `OOD — ${o.ood_label}${o.fine_grained ? " (fine-grained)" : ""}` : o.verdict === "id" ? `ID — ${className(o.id_class)}` : "ambiguous";
    return `Decided at Stage ${o.stage}: ${what}.`;
  }
  if (item.status === "stage3") return "The two Stage-1 verdicts differ: the image waits for the joint review in Stage 3.";
  if (item.status === "final") return "Decided.";
  return item.my_stage1 ? "Your verdict is in; you can revise or undo it until both verdicts are in." : "Waiting for your verdict.";
}

function labelCell(item, v, differs) {
  // the label as typed, and under it the WordNet sense it means (its gloss is listed below the table)
  const td = el("td", differs ? { class: "differs" } : {}, v.ood_label || "");
  if (v.ood_sense) {
    const s = (item.senses || {})[v.ood_sense];
    td.append(el("div", { class: "sense", text: s ? `= ${s.lemmas.join(", ")} (${v.ood_sense})` : v.ood_sense }));
  } else if (v.verdict === "ood") td.append(el("div", { class: "sense", text: "free label" }));
  return td;
}

async function loadSenses(selected = null) {
  // the WordNet noun senses of the typed label, with glosses; "free label" matches only the same label
  const label = $("#ood-label").value.trim();
  const select = $("#ood-sense");
  const keep = selected !== null ? selected : select.value;
  const res = label ? await api(`/api/senses?label=${encodeURIComponent(label)}`) : { senses: [] };
  if ($("#ood-label").value.trim() !== label) return; // typed on meanwhile
  while (select.options.length > 1) select.remove(1);
  for (const s of res.senses) select.append(el("option", { value: s.wnid, text: `${s.lemmas.join(", ")} — ${s.gloss}` }));
  select.value = res.senses.some((s) => s.wnid === keep) ? keep : "";
}

function renderStage3(item) {
  const panel = $("#stage3-panel");
  panel.hidden = !(state.stage === 3 && item.in_stage3);
  if (panel.hidden) return;
  const diff = item.differences || [];
  $("#stage3-differences").textContent = `The Stage-1 verdicts differ on: ${diff.map((d) => FIELD_NAMES[d]).join(", ") || "nothing"}.`;
  const body = $("#stage3-table tbody");
  body.replaceChildren();
  const cell = (text, field) => el("td", diff.includes(field) ? { class: "differs", text } : { text });
  for (const v of [...(item.stage1 || []), ...(item.stage3 || [])]) {
    body.append(el("tr", { class: `verdict-row stage${v.stage}` },
      el("td", { text: String(v.stage) }), el("td", { text: v.annotator }), cell(v.verdict, "verdict"),
      labelCell(item, v, diff.includes("ood_label")), cell(v.fine_grained ? "yes" : "", "fine_grained"),
      cell(className(v.id_class), "id_class"), el("td", { class: "note", text: v.note || "" })));
  }
  const glosses = $("#stage3-senses");
  glosses.replaceChildren();
  for (const [wnid, s] of Object.entries(item.senses || {})) glosses.append(el("dt", { text: `${s.lemmas.join(", ")} (${wnid})` }), el("dd", { text: s.gloss }));
  const o = item.outcome || {};
  $("#stage3-outcome").textContent = o.status === "final" ? `Decided: ${o.verdict}${o.ood_label ? " — " + o.ood_label : ""}`
    : "Waiting for all three Stage-3 verdicts: all three must agree on the verdict, OOD label, fine-grained flag and ID class.";
}

function fillForm(v) {
  $("#verdict-form").reset();
  if (!v) return;
  $(`#v-${v.verdict}`).checked = true;
  $("#ood-label").value = v.ood_label || "";
  $("#fine-grained").checked = !!v.fine_grained;
  $("#id-class").value = v.id_class === null || v.id_class === undefined ? "" : String(v.id_class);
  $("#note").value = v.note || "";
  loadSenses(v.ood_sense || "").catch((err) => say(err.message, "error"));
}

function myVerdict(item) {
  return state.stage === 1 ? item.my_stage1 : (item.stage3 || []).find(mine);
}

async function show(pos, seq = ++state.seq) {
  state.pos = pos;
  state.done = false;
  $("#done").hidden = true;
  const empty = state.items.length === 0;
  $("#empty").hidden = !empty;
  $("#empty").textContent = state.stage === 3 ? "No image is in Stage 3 yet (new ones appear here by themselves)." : "Nothing in this queue.";
  $("#position").textContent = positionText();
  if (empty) {
    state.item = null;
    $("#item").hidden = true;
    return;
  }
  const item = await api(`/api/item?image=${encodeURIComponent(state.items[pos].image)}`);
  if (seq !== state.seq) return;
  state.item = item;
  $("#item").hidden = false;
  $("#image").src = item.image_url;
  $("#image").dataset.image = item.image;
  $("#meta").textContent = item.image;
  $("#state").textContent = describeState(item);
  renderEvidence(item);
  renderStage3(item);
  const own = myVerdict(item);
  $("#ood-sense").value = "";
  fillForm(own);
  $("#form-legend").textContent = state.stage === 1 ? "Your Stage-1 verdict (independent)" : "Your Stage-3 verdict (joint review)";
  const open = state.stage === 1 ? item.status === "stage1" : item.status === "stage3";
  $("#submit").disabled = !open;
  const undoable = own && (state.stage === 1 ? item.status === "stage1" : item.status === "stage3"); // agreement is final
  $("#undo").disabled = !undoable;
}

async function post(body, done) {
  if (state.busy) return;
  state.busy = true;
  try {
    const res = await api("/api/verdict", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    if (document.activeElement) document.activeElement.blur(); // the next keys navigate, not edit the last field
    await loadMe();
    await loadQueue(state.stage, done === "undo" ? res.image : null);
    const left = state.items.filter((i) => !i.done).length;
    say(done === "undo" ? `undone: your verdict on ${res.image} is withdrawn (row ${res.row})`
      : `saved ${body.verdict} for ${res.image} (row ${res.row})` + (left ? "" : " — this queue is finished"));
  } catch (err) {
    say(err.message, "error");
  } finally {
    state.busy = false;
  }
}

function submit(event) {
  if (event) event.preventDefault();
  if (!state.item || $("#submit").disabled) return say("nothing to submit here", "error");
  const checked = document.querySelector("input[name=verdict]:checked");
  if (!checked) return say("choose OOD (o), ID (i) or ambiguous (a) first", "error");
  const verdict = checked.value;
  const body = { image: state.item.image, stage: state.stage, verdict, note: $("#note").value || null,
    submission: submissionId(), base: state.item.my_last_row[state.stage] };
  if (verdict === "ood") {
    body.ood_label = $("#ood-label").value;
    body.ood_sense = $("#ood-sense").value || null;
    body.fine_grained = $("#fine-grained").checked;
  }
  if (verdict === "id") body.id_class = $("#id-class").value === "" ? null : Number($("#id-class").value);
  return post(body, "saved");
}

function undo() {
  if (!state.item || $("#undo").disabled) return say("nothing to undo here", "error");
  return post({ image: state.item.image, stage: state.stage, verdict: "withdrawn", submission: submissionId(),
    base: state.item.my_last_row[state.stage] }, "undo");
}

function chooseVerdict(v, focus) {
  $(`#v-${v}`).checked = true;
  if (v !== "ood") $("#fine-grained").checked = false;
  $(focus || `#v-${v}`).focus();
}

function onKey(event) {
  const t = event.target;
  const inForm = $("#verdict-form").contains(t);
  const typing = t instanceof HTMLSelectElement || t instanceof HTMLTextAreaElement
    || (t instanceof HTMLInputElement && !["radio", "checkbox"].includes(t.type));
  if (event.key === "Escape") { if (state.item) $("#verdict-form").focus(); return; }
  if (event.key === "Enter") {
    // only inside the verdict form; on links, tabs and buttons elsewhere Enter keeps its usual meaning
    if (inForm && !(t instanceof HTMLButtonElement)) { event.preventDefault(); submit(); }
    return;
  }
  if (typing || event.ctrlKey || event.metaKey || event.altKey || !state.me || $("#app").hidden) return;
  const k = event.key;
  if (k === "s" && state.me.role === "stage1") loadQueue(state.stage === 1 ? 3 : 1);
  else if (state.done && ["n", "p", "ArrowRight", "ArrowLeft"].includes(k)) show(["n", "ArrowRight"].includes(k) ? 0 : state.items.length - 1);
  else if ((k === "n" || k === "ArrowRight") && state.items.length && state.pos + 1 < state.items.length) show(state.pos + 1);
  else if ((k === "p" || k === "ArrowLeft") && state.items.length && state.pos > 0) show(state.pos - 1);
  else if (!state.item) return;
  else if (k === "o") chooseVerdict("ood", "#ood-label");
  else if (k === "i") chooseVerdict("id", "#id-class");
  else if (k === "a") chooseVerdict("ambiguous");
  else if (k === "f") { chooseVerdict("ood", "#fine-grained"); $("#fine-grained").checked = !$("#fine-grained").checked; }
  else if (/^[1-9]$/.test(k) && state.shortcutClasses[Number(k) - 1] !== undefined) {
    chooseVerdict("id", "#id-class");
    $("#id-class").value = String(state.shortcutClasses[Number(k) - 1]);
  }
  else if (k === "u") undo();
  else return;
  event.preventDefault();
}

async function main() {
  try {
    await loadMe();
  } catch (err) {
    $("#login").hidden = false;
    $("#binding").value = binding();
    if (location.hash === "#login-failed") $("#login-error").textContent = "That access token is not valid. Use the one `oodeval construct init` printed for you, or ask for a new one (`construct token reissue`).";
    else if (err.status !== 401) $("#login-error").textContent = `The server answered: ${err.message}`;
    $("#token-input").focus();
    return;
  }
  if (location.hash) history.replaceState(null, "", "/");
  $("#app").hidden = false;
  document.querySelectorAll("nav button").forEach((b) => b.addEventListener("click", () => loadQueue(Number(b.dataset.stage))));
  $("#verdict-form").addEventListener("submit", submit);
  $("#undo").addEventListener("click", undo);
  let typed = null;
  $("#ood-label").addEventListener("input", () => {
    clearTimeout(typed);
    typed = setTimeout(() => loadSenses().catch((err) => say(err.message, "error")), 250);
  });
  document.addEventListener("keydown", onKey);
  await loadQueue(state.me.role === "stage1" ? 1 : 3);
  setInterval(poll, POLL_MS);
}

main();
