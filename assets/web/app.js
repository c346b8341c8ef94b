// Lantern browser chat: talks to the same-origin OpenAI API (/v1), keeps conversations in
// localStorage, streams replies over SSE, and shows live stats from /metrics.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = "lantern.conversations", SETTINGS = "lantern.settings";
const state = {
  conversations: JSON.parse(localStorage.getItem(STORE) || "[]"),
  current: null,
  settings: Object.assign({ system: "", temperature: 0.7, maxTokens: 512, apiKey: "", model: "" },
    JSON.parse(localStorage.getItem(SETTINGS) || "{}")),
  controller: null,
  chatOff: "",  // the notice when the served model is no chat model (loadModels)
};

function save() {
  localStorage.setItem(STORE, JSON.stringify(state.conversations));
  localStorage.setItem(SETTINGS, JSON.stringify(state.settings));
}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.settings.apiKey) h.Authorization = `Bearer ${state.settings.apiKey}`;
  return h;
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

async function explain(response) {
  let detail = "";
  try { detail = (await response.json()).error.message; } catch (_) { /* not JSON */ }
  if (response.status === 401) return "The server needs a valid API key: enter it in Settings.";
  if (response.status === 404) return `Model not found: ${detail}`;
  if (response.status === 503) return "The server is busy (queue full). Try again in a moment.";
  return `Request failed (${response.status}): ${detail || response.statusText}`;
}

// ---- rendering ------------------------------------------------------------------------
// A reply's reasoning arrives apart (delta.reasoning_content) and is kept in msg.reasoning.
// Replies saved before that, or from a server that does not split it, carry it inline.
const THINK = /^\s*<think>([\s\S]*?)(<\/think>|$)([\s\S]*)$/;

function splitReply(msg) {
  if (msg.reasoning) return { reasoning: msg.reasoning, answer: msg.content };
  const m = msg.content.match(THINK);
  return m ? { reasoning: m[1], answer: m[3] || "" } : { reasoning: "", answer: msg.content };
}

// What is sent back to the model: the answer only, never the reasoning.
function historyEntry({ role, content }) {
  if (role !== "assistant") return { role, content };
  const { reasoning, answer } = splitReply({ content });
  return { role, content: reasoning ? answer.trimStart() : content };
}

// Clipboard API where the page is a secure context (localhost is); a hidden textarea otherwise
// (a server reached by its LAN address over plain http).
async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
  const area = document.createElement("textarea");
  area.value = text;
  area.style.position = "fixed"; area.style.opacity = "0";
  document.body.appendChild(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}

function copyButton(label, getText) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy";
  button.textContent = label;
  button.onclick = async () => {
    try { await copyText(getText()); button.textContent = "Copied"; }
    catch (_) { button.textContent = "Copy failed"; }
    setTimeout(() => { button.textContent = label; }, 1500);
  };
  return button;
}

// The "Thinking" block stays open while the model thinks and folds once when the answer starts
// (updated in place, so a block the user reopened stays open); the answer is rendered below it.
function fillReply(el, msg) {
  const { reasoning, answer } = splitReply(msg);
  let think = el.querySelector(":scope > details.think");
  if (reasoning && !think) {
    think = document.createElement("details");
    think.className = "think";
    think.innerHTML = '<summary>Thinking</summary><div class="think-body"></div>';
    think.open = !answer;
    if (answer) think.dataset.folded = "1";
    el.prepend(think);
  }
  if (think) {
    think.querySelector(".think-body").textContent = reasoning.trim();
    if (answer && !think.dataset.folded) { think.open = false; think.dataset.folded = "1"; }
  }
  let body = el.querySelector(":scope > .answer");
  if (!body) {
    body = document.createElement("div");
    body.className = "answer";
    el.appendChild(body);
  }
  body.innerHTML = Markdown.render(answer);
  for (const pre of body.querySelectorAll("pre")) pre.prepend(copyButton("Copy code", () => pre.querySelector("code").textContent));
}

function messageElement(msg) {
  const el = document.createElement("div");
  el.className = `msg ${msg.role}`;
  if (msg.role === "assistant") fillReply(el, msg);
  else el.innerHTML = Markdown.escape(msg.content).replace(/\n/g, "<br>");
  return el;
}

// The actions row under an assistant reply, added once it is complete.
function replyActions(msg) {
  const row = document.createElement("div");
  row.className = "msg-actions";
  row.appendChild(copyButton("Copy", () => splitReply(msg).answer));
  return row;
}

function renderMessages() {
  const box = $("messages");
  box.innerHTML = "";
  for (const msg of state.current ? state.current.messages : []) {
    box.appendChild(messageElement(msg));
    if (msg.role === "assistant" && splitReply(msg).answer) box.appendChild(replyActions(msg));
  }
  box.scrollTop = box.scrollHeight;
}

function renderConversations() {
  const list = $("conversations");
  list.innerHTML = "";
  for (const conv of state.conversations) {
    const li = document.createElement("li");
    const title = document.createElement("span");
    title.className = "title";
    title.textContent = conv.title || "New chat";
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "delete";
    remove.textContent = "×";
    remove.title = remove.ariaLabel = "Delete conversation";
    remove.onclick = (e) => { e.stopPropagation(); deleteConversation(conv); };
    li.append(title, remove);
    li.className = conv === state.current ? "active" : "";
    li.onclick = () => { state.current = conv; renderConversations(); renderMessages(); document.body.classList.remove("sidebar-open"); };
    list.appendChild(li);
  }
}

function newConversation() {
  const conv = { id: Date.now().toString(36), title: "", messages: [] };
  state.conversations.unshift(conv);
  state.current = conv;
  save(); renderConversations(); renderMessages();
}

function deleteConversation(conv) {
  if (conv === state.current && state.controller) state.controller.abort();
  state.conversations = state.conversations.filter((c) => c !== conv);
  if (conv === state.current) state.current = state.conversations[0] || null;
  save(); renderConversations(); renderMessages();
}

// ---- talking to the server ----------------------------------------------------------------
const TASK_ROUTES = { embed: "/v1/embeddings", score: "/v1/rerank and /v1/score", classify: "/v1/classify" };

function offMessage(task) {
  const what = { embed: "embeddings", score: "reranking scores", classify: "classifications" }[task] || task;
  return `This model serves ${what} (${TASK_ROUTES[task] || "its own routes"}), not chat: the chat is off.`;
}

async function loadModels() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    if (!r.ok) { showError(await explain(r)); return; }
    const select = $("model");
    select.innerHTML = "";
    const models = (await r.json()).data;
    for (const m of models) {
      const opt = document.createElement("option");
      opt.value = opt.textContent = m.id;
      select.appendChild(opt);
    }
    if (state.settings.model && [...select.options].some((o) => o.value === state.settings.model)) select.value = state.settings.model;
    showError("");
    // An embedding / reranking / classification model answers no chat: say so once, instead of an error per message.
    const task = (models[0] || {}).task;
    state.chatOff = Boolean(task) && task !== "generate" ? offMessage(task) : "";
    $("input").disabled = $("send").disabled = Boolean(state.chatOff);
    if (state.chatOff) { $("input").placeholder = state.chatOff; showError(state.chatOff); }
  } catch (e) { showError(`Cannot reach the server: ${e.message}`); }
}

async function send(text) {
  if (!state.current) newConversation();
  const conv = state.current;
  conv.messages.push({ role: "user", content: text });
  if (!conv.title) conv.title = text.slice(0, 40);
  const reply = { role: "assistant", content: "", reasoning: "" };
  conv.messages.push(reply);
  save(); renderConversations(); renderMessages();
  const bubble = $("messages").lastElementChild;
  const history = conv.messages.slice(0, -1).map(historyEntry);
  if (state.settings.system) history.unshift({ role: "system", content: state.settings.system });
  const body = {
    model: $("model").value, messages: history, stream: true,
    temperature: Number(state.settings.temperature), max_tokens: Number(state.settings.maxTokens),
  };
  state.controller = new AbortController();
  setBusy(true);
  const started = performance.now();
  let first = null, tokens = 0;
  try {
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body), signal: state.controller.signal });
    if (!r.ok) {
      // Nothing was generated (bad key, prompt too long, busy): take the turn back out, so the
      // conversation keeps alternating roles, and hand the prompt back to edit or resend.
      conv.messages.splice(-2, 2);
      if (!conv.messages.length) conv.title = "";
      $("input").value = text;
      showError(await explain(r));
      renderConversations(); renderMessages();
      return;
    }
    showError("");
    const reader = r.body.getReader(), decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
        const delta = JSON.parse(event.slice(6)).choices?.[0]?.delta || {};
        if (!delta.content && !delta.reasoning_content) continue;
        if (first === null) { first = performance.now(); $("stat-ttft").textContent = `${((first - started) / 1000).toFixed(2)} s`; }
        tokens += 1;
        reply.reasoning += delta.reasoning_content || "";
        reply.content += delta.content || "";
        fillReply(bubble, reply);
        $("messages").scrollTop = $("messages").scrollHeight;
        const secs = (performance.now() - first) / 1000;
        if (secs > 0) $("stat-tps").textContent = (tokens / secs).toFixed(1);
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") showError(`Connection lost: ${e.message}`);
  } finally {
    state.controller = null;
    setBusy(false);
    if (splitReply(reply).answer && bubble.isConnected) bubble.after(replyActions(reply));
    save();
  }
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
}

// ---- live stats from /metrics ------------------------------------------------------------
async function pollMetrics() {
  try {
    const r = await fetch("/metrics", { headers: headers() });
    if (r.ok) {
      const text = await r.text();
      const read = (name) => { const m = text.match(new RegExp(`^lantern:${name}\\{[^}]*\\} ([0-9.e+-]+)`, "m")); return m ? Number(m[1]) : null; };
      const kv = read("kv_cache_usage_perc");
      if (kv !== null) $("stat-kv").textContent = `${(kv * 100).toFixed(0)}%`;
      $("stat-running").textContent = read("num_requests_running") ?? "–";
      $("stat-waiting").textContent = read("num_requests_waiting") ?? "–";
    }
  } catch (_) { /* the next poll will try again */ }
}

// ---- wiring -----------------------------------------------------------------------------
function openSettings() {
  $("set-system").value = state.settings.system;
  $("set-temperature").value = state.settings.temperature;
  $("set-max-tokens").value = state.settings.maxTokens;
  $("set-api-key").value = state.settings.apiKey;
  $("settings").showModal();
}

$("save-settings").onclick = () => {
  state.settings.system = $("set-system").value;
  state.settings.temperature = Number($("set-temperature").value);
  state.settings.maxTokens = Number($("set-max-tokens").value);
  state.settings.apiKey = $("set-api-key").value.trim();
  save();
  loadModels();
};
$("open-settings").onclick = openSettings;
$("new-chat").onclick = newConversation;
$("toggle-sidebar").onclick = () => document.body.classList.toggle("sidebar-open");
$("backdrop").onclick = () => document.body.classList.remove("sidebar-open");
$("model").onchange = () => { state.settings.model = $("model").value; save(); };
$("stop").onclick = () => state.controller && state.controller.abort();
$("composer").onsubmit = (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || state.controller || state.chatOff) return;
  $("input").value = "";
  send(text);
};
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
});

state.current = state.conversations[0] || null;
renderConversations();
renderMessages();
loadModels();
pollMetrics();
setInterval(pollMetrics, 2000);
