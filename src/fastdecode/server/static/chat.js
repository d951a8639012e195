// The chat page of `fastdecode serve`: plain JavaScript, no build step, nothing from another host.
// Text from the model and the user only ever reaches the page through textContent, never as HTML.
"use strict";

const STORE = "fastdecode.chat";  // localStorage: the conversation and the settings
const KEY = "fastdecode.apiKey";  // sessionStorage: the API key, forgotten when the tab closes
const FIELDS = ["system", "temperature", "top_p", "max_tokens", "seed", "tools"];
const $ = (id) => document.getElementById(id);

// {messages: [{role, content, reasoning?, tool_calls?, tool_call_id?, name?, stats?, note?}], settings: {field: text}}
let state = load();
let controller = null;    // aborts the reply being streamed (Stop)
let modelName = null;
let sendAfterKey = false; // a message was refused for want of a key: send it once one is accepted
let streaming = null;     // the reply being streamed: its tool calls get no result box yet

function load() {
  try {
    const s = JSON.parse(localStorage.getItem(STORE));
    if (s && Array.isArray(s.messages)) return {settings: {}, ...s};
  } catch (e) { /* unreadable: start afresh */ }
  return {messages: [], settings: {}};
}

function save() {
  try { localStorage.setItem(STORE, JSON.stringify(state)); } catch (e) { /* full or off: the page still works */ }
}

// -- rendering: paragraphs, and ``` fences as monospace boxes ------------------------------------

function renderText(el, text) {
  el.replaceChildren();
  let para = [], code = null;
  const add = (tag, lines) => {
    const node = document.createElement(tag);
    node.textContent = lines.join("\n");
    if (tag === "code") { const pre = document.createElement("pre"); pre.append(node); el.append(pre); }
    else el.append(node);
  };
  const flush = () => { if (para.length) add("p", para); para = []; };
  for (const line of text.split("\n")) {
    if (/^\s*```/.test(line)) {  // a fence opens or closes a block (its language tag is not shown)
      if (code === null) { flush(); code = []; } else { add("code", code); code = null; }
    } else if (code !== null) code.push(line);
    else if (line.trim() === "") flush();
    else para.push(line);
  }
  if (code !== null) add("code", code);  // still streaming, or never closed
  flush();
}

function metaText(m) {
  const parts = [];
  const s = m.stats;
  if (s) {
    parts.push(`${s.tokens} tokens`);
    if (s.tokensPerS != null) parts.push(`${s.tokensPerS.toFixed(1)} tokens/s`);
    if (s.ttftMs != null) parts.push(`first token ${Math.round(s.ttftMs)} ms`);
  }
  if (m.note) parts.push(m.note);
  return parts.join(" · ");
}

// -- tool calls: shown as a call (function name, arguments), with a box for its result -------------

function prettyArguments(text) {
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch (e) { return text; }  // still streaming
}

function resultOf(call) {
  return state.messages.find((r) => r.role === "tool" && r.tool_call_id === call.id);
}

function toolCallEl(call, done) {
  const el = document.createElement("div");
  el.className = "tool-call";
  const head = document.createElement("div");
  head.className = "call-head";
  const label = document.createElement("span");
  label.textContent = "Call ";
  const name = document.createElement("code");
  name.className = "call-name";
  name.textContent = call.function.name;
  head.append(label, name);
  const args = document.createElement("pre");
  const code = document.createElement("code");
  code.className = "call-arguments";
  code.textContent = prettyArguments(call.function.arguments);
  args.append(code);
  el.append(head, args);
  if (done && !resultOf(call)) {  // the answer the client would give: typed in here
    const form = document.createElement("form");
    form.className = "call-result";
    const input = document.createElement("textarea");
    input.rows = 1;
    input.placeholder = `Result of ${call.function.name}`;
    input.setAttribute("aria-label", `Result of ${call.function.name}`);
    const button = document.createElement("button");
    button.type = "submit";
    button.textContent = "Send result";
    form.append(input, button);
    form.addEventListener("submit", (e) => { e.preventDefault(); sendResult(call, input.value); });
    el.append(form);
  }
  return el;
}

function messageEl(m) {
  const el = document.createElement("article");
  el.className = `msg ${m.role}`;
  const who = document.createElement("div");
  who.className = "who";
  const call = m.role === "tool" && toolCallFor(m.tool_call_id);
  who.textContent = m.role === "user" ? "You" : m.role === "tool"
    ? `Result of ${call ? call.function.name : m.tool_call_id}` : (m.model || "Assistant");
  const body = document.createElement("div");
  body.className = "body";
  if (m.reasoning) {  // a thinking model's thought (reasoning_content): folded once the answer starts
    const thought = document.createElement("details");
    thought.className = "thinking";
    thought.open = m === streaming && !m.content;
    const summary = document.createElement("summary");
    summary.textContent = "Thinking";
    const text = document.createElement("div");
    renderText(text, m.reasoning);
    thought.append(summary, text);
    body.append(thought);
  }
  const answer = document.createElement("div");
  renderText(answer, m.content || "");
  body.append(answer);
  for (const c of m.tool_calls || []) body.append(toolCallEl(c, m !== streaming));
  const meta = document.createElement("div");
  meta.className = "meta";
  meta.textContent = metaText(m);
  el.append(who, body, meta);
  return el;
}

function toolCallFor(id) {
  for (const m of state.messages) {
    const c = (m.tool_calls || []).find((t) => t.id === id);
    if (c) return c;
  }
  return null;
}

// A result typed in for a call; once every call of that reply has one, the model answers.
function sendResult(call, text) {
  if (controller) return;
  state.messages.push({role: "tool", tool_call_id: call.id, content: text});
  const owner = state.messages.findLast((m) => (m.tool_calls || []).includes(call));
  if (owner.tool_calls.every(resultOf)) reply();
  else { render(); save(); }
}

// Redraws the transcript, or only its last message while a reply streams in; it follows the
// end unless the reader has scrolled up.
function render({lastOnly = false, follow = false} = {}) {
  const t = $("transcript");
  const atEnd = t.scrollHeight - t.scrollTop - t.clientHeight < 40;
  if (lastOnly && t.lastElementChild) t.lastElementChild.replaceWith(messageEl(state.messages.at(-1)));
  else t.replaceChildren(...state.messages.map(messageEl));
  if (atEnd || follow) t.scrollTop = t.scrollHeight;
}

let pending = false;
function renderSoon() {  // at most once a frame
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => { pending = false; render({lastOnly: true}); save(); });
}

function showError(text, retry = false) {
  $("error-text").textContent = text;
  $("retry").hidden = !retry;
  $("error").hidden = false;
}

function hideError() { $("error").hidden = true; }

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
}

// -- the server ------------------------------------------------------------------------------

function headers() {
  const h = {"Content-Type": "application/json"};
  const key = sessionStorage.getItem(KEY);
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function apiError(res) {  // the server's one-line message from OpenAI's error shape
  let message = `HTTP ${res.status}`;
  try { message = (await res.json()).error.message || message; } catch (e) { /* not JSON */ }
  return new ApiError(res.status, message);
}

// Server-sent events from a fetch body: {event, data} per block of lines ended by a blank line.
async function* events(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  try {
    for (;;) {
      const {value, done} = await reader.read();
      if (done) return;
      buf += value;
      let end;
      while ((end = buf.search(/\r?\n\r?\n/)) >= 0) {
        const block = buf.slice(0, end);
        buf = buf.slice(end).replace(/^\r?\n\r?\n/, "");
        let event = "message";
        const data = [];
        for (const line of block.split(/\r?\n/)) {
          if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
          else if (line.startsWith("event:")) event = line.slice(6).trim();
        }
        if (data.length) yield {event, data: data.join("\n")};
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

function requestBody() {
  const s = state.settings;
  // A reply stopped before its first token has nothing to send.
  const messages = state.messages.filter((m) => m.content || m.tool_calls?.length || m.role === "tool")
    .map(({role, content, tool_calls, tool_call_id}) => {
      const out = {role, content: content || (tool_calls?.length ? null : "")};
      if (tool_calls?.length) out.tool_calls = tool_calls;
      if (tool_call_id) out.tool_call_id = tool_call_id;
      return out;
    });
  if ((s.system || "").trim()) messages.unshift({role: "system", content: s.system});
  const body = {messages, stream: true, stream_options: {include_usage: true}};
  if ((s.tools || "").trim()) {
    try { body.tools = JSON.parse(s.tools); } catch (e) { throw new ApiError(400, `Tools is not valid JSON: ${e.message}`); }
  }
  if (modelName) body.model = modelName;
  for (const f of ["temperature", "top_p", "max_tokens", "seed"]) {
    if ((s[f] ?? "") !== "") body[f] = Number(s[f]);  // empty: the server's default; bad: the server says why
  }
  return body;
}

async function loadModel() {
  try {
    const res = await fetch("v1/models", {headers: headers()});
    if (res.status === 401) { keyRefused(await apiError(res)); return false; }
    if (res.status === 503) { $("model").textContent = "loading…"; setTimeout(loadModel, 1000); return false; }
    if (!res.ok) throw await apiError(res);
    modelName = (await res.json()).data[0].id;
    $("model").textContent = modelName;
    return true;
  } catch (e) {
    $("model").textContent = "no model";
    showError(e instanceof ApiError ? e.message : `cannot reach the server (${e.message})`);
    return false;
  }
}

// A 401: ask for a key; when one was sent, say why the server refused it.
function keyRefused(err) {
  const sent = sessionStorage.getItem(KEY) !== null;
  sessionStorage.removeItem(KEY);
  $("key-message").textContent = sent ? err.message : "This server needs an API key.";
  $("key-form").hidden = false;
  $("key").focus();
}

// -- a conversation turn ------------------------------------------------------------------------

function send() {
  const text = $("input").value;
  if (!text.trim() || controller) return;  // an empty message is not sent
  $("input").value = "";
  state.messages.push({role: "user", content: text});
  reply();
}

async function reply() {
  hideError();
  // "interrupted" until the reply ends: what a reload mid-stream finds in storage.
  const m = {role: "assistant", content: "", model: modelName, note: "interrupted"};
  let body;
  try { body = requestBody(); } catch (e) { state.messages.push(m); failed(e, m); render(); save(); return; }
  state.messages.push(m);
  streaming = m;
  render({follow: true});
  save();
  controller = new AbortController();
  setBusy(true);
  const t0 = performance.now();
  let tFirst = null, tLast = null, pieces = 0, usage = null, finish = null, done = false;
  try {
    const res = await fetch("v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal});
    if (!res.ok) throw await apiError(res);
    for await (const ev of events(res.body)) {
      if (ev.data === "[DONE]") { done = true; break; }
      const data = JSON.parse(ev.data);
      if (ev.event === "error") throw new ApiError(500, data.error?.message || "the server failed");
      if (data.usage) usage = data.usage;
      const choice = data.choices?.[0];
      if (!choice) continue;
      if (choice.finish_reason) finish = choice.finish_reason;
      const calls = choice.delta?.tool_calls;
      const thought = choice.delta?.reasoning_content;
      if (choice.delta?.content || calls || thought) {
        tLast = performance.now();
        tFirst ??= tLast;
        pieces += 1;
        m.content += choice.delta.content || "";
        if (thought) m.reasoning = (m.reasoning || "") + thought;
        for (const c of calls || []) {  // index, then id and name once, then argument fragments
          m.tool_calls ??= [];
          const t = m.tool_calls[c.index] ??= {id: "", type: "function", function: {name: "", arguments: ""}};
          if (c.id) t.id = c.id;
          if (c.function?.name) t.function.name += c.function.name;
          if (c.function?.arguments) t.function.arguments += c.function.arguments;
        }
        renderSoon();
      }
    }
    if (!done) throw new TypeError("the stream ended early");
    m.note = {length: "max tokens reached", abort: "aborted by the server"}[finish] || null;
  } catch (e) {
    failed(e, m);
  } finally {
    controller = null;
    streaming = null;
    setBusy(false);
    if (state.messages.includes(m)) {
      // Decode speed: tokens after the first over the time they took; the first one's wait is TTFT.
      const tokens = usage?.completion_tokens ?? pieces;  // no usage when stopped: the pieces seen
      m.stats = tFirst === null ? null : {
        tokens, ttftMs: tFirst - t0, tokensPerS: tokens > 1 && tLast > tFirst ? (tokens - 1) / ((tLast - tFirst) / 1000) : null};
    }
    render();
    save();
  }
}

function failed(e, m) {
  if (e.name === "AbortError") { m.note = "stopped"; return; }  // Stop: the server frees the slot on disconnect
  if (m.content || m.tool_calls || (e instanceof ApiError && e.status === 500)) {  // mid-stream: keep what arrived
    m.note = e instanceof ApiError ? `error: ${e.message}` : "connection lost";
    showError(e instanceof ApiError ? e.message : "connection lost: the partial reply is kept", true);
    return;
  }
  // Refused before the reply began (bad request, key, server gone): take the message back for editing;
  // after tool results, they stay and Retry sends them again.
  state.messages.pop();
  const afterResults = state.messages.at(-1)?.role === "tool";
  if (state.messages.at(-1)?.role === "user") {
    const user = state.messages.pop();
    if (!$("input").value) $("input").value = user.content;
  }
  if (e instanceof ApiError && e.status === 401) {
    sendAfterKey = true;
    keyRefused(e);
  } else if (e instanceof ApiError) {
    showError(e.message, afterResults);
  } else {
    showError(`cannot reach the server (${e.message})`, afterResults);
  }
}

function retry() {  // a new reply in place of the one that broke off
  const last = state.messages.at(-1);
  if (controller || !last) return;
  if (last.role === "assistant") state.messages.pop();
  reply();
}

function newChat() {
  if (controller) controller.abort();
  state.messages = [];
  hideError();
  render();
  save();
  $("input").focus();
}

// -- wiring ----------------------------------------------------------------------------------

function start() {
  for (const f of FIELDS) {
    const el = $(f);
    if (state.settings[f] !== undefined) el.value = state.settings[f];
    else state.settings[f] = el.value;
    el.addEventListener("input", () => { state.settings[f] = el.value; save(); });
  }
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  $("stop").addEventListener("click", () => controller && controller.abort());
  $("new-chat").addEventListener("click", newChat);
  $("retry").addEventListener("click", retry);
  $("key-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY, $("key").value.trim());
    if (await loadModel()) {
      $("key-form").hidden = true;
      $("key").value = "";
      hideError();
      if (sendAfterKey) { sendAfterKey = false; send(); }
    }
  });
  render();
  loadModel();
  $("input").focus();
}

start();
