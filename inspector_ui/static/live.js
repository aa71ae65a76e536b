// Live updates over server-sent events (/_tooltap/api/live).
//
// Streaming turns are drawn with createElement/textContent only. When a turn is stored,
// its row or card (and the session page's header) is fetched from the server, rendered by
// the same autoescaped templates as a full page load, and parsed with DOMParser (which
// never runs scripts; the page's Content-Security-Policy forbids inline script anyway).
"use strict";

(function () {
  const page = document.body.dataset.page;
  if (page !== "sessions" && page !== "session") return;
  const sessionId = document.body.dataset.session || null;
  const flying = new Map(); // live_id -> element
  const dot = document.getElementById("live-status");

  // Bidirectional controls shown as marks, as the server-rendered pages show them: they
  // could make streaming text read as something else.
  const BIDI_CONTROLS = /[\u202a-\u202e\u2066-\u2069]/g;
  function visible(text) {
    return String(text).replace(BIDI_CONTROLS,
      (c) => "\u27e8U+" + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0") + "\u27e9");
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = visible(text);
    return e;
  }

  // The first element of the fragment that `selector` finds (a row parses only in a table).
  function parse(html, selector) {
    if (selector === "tr") html = "<table><tbody>" + html + "</tbody></table>";
    const doc = new DOMParser().parseFromString(html, "text/html");
    const found = doc.body.querySelector(selector);
    return found ? document.adoptNode(found) : null;
  }

  function container() {
    return document.getElementById(page === "sessions" ? "live-turns" : "in-flight");
  }

  function started(ev) {
    // A session's page shows its own turns in flight, and those the writer has yet to place.
    if (sessionId && ev.session_id && ev.session_id !== sessionId) return;
    const box = el("div", "live-turn");
    box.dataset.liveId = ev.live_id;
    box.dataset.testid = "live-turn";
    const head = el("div", "live-head");
    const model = el("span", "live-model", "");
    model.dataset.testid = "live-model";
    const doing = el("b", null, ev.stream ? " streaming " : " answering ");  // a JSON answer still arriving
    head.append(el("span", "pulse", "●"), doing, sessionPart(ev.session_id), model,
      el("code", null, ev.method + " " + ev.path), el("span", "muted", " " + ev.api + " · HTTP " + ev.http_status));
    const status = el("span", "live-state", "");
    head.append(status);
    const text = el("pre", "live-text", "");
    box.append(head, text);
    box._status = status;
    box._model = model;
    box._text = text;
    showModel(box, ev.model);
    container().append(box);
    flying.set(ev.live_id, box);
  }

  // Which session a streaming turn is in, when that is known before it is stored: the
  // client named it (X-Tooltap-Session). The writer threads the others once stored.
  function sessionPart(id) {
    const part = el("span", "live-session");
    part.dataset.testid = "live-session";
    if (id && id === sessionId) {
      part.append("in this session ");
    } else if (id) {
      const row = document.querySelector('tr[data-session="' + CSS.escape(id) + '"] td.title a');
      const a = el("a", null, row ? row.textContent : id);  // its title where the list shows it
      a.href = "/_tooltap/sessions/" + encodeURIComponent(id);
      part.append("in session ", a, " ");
    }
    return part;
  }

  function showModel(box, model) {
    if (!model || box._model.textContent) return;
    box._model.append("model ", el("b", null, model), " · ");
  }

  function growing(ev) {
    const box = flying.get(ev.live_id);
    if (!box) return;
    showModel(box, ev.model);
    box._text.textContent = visible(ev.text);
    box._status.textContent = " · " + ev.bytes + " bytes";
  }

  function finished(ev) {
    const box = flying.get(ev.live_id);
    if (box) box._status.textContent = " · " + ev.status + ", storing…";
  }

  // Stored turns are drawn one after another, in the order they were stored: two stored
  // together would otherwise both find no row (or card) before their fetches return, and
  // add it twice (and count it twice), or in the wrong order.
  let drawing = Promise.resolve();

  function stored(ev) {
    const box = flying.get(ev.live_id);
    flying.delete(ev.live_id);
    drawing = drawing.then(() => draw(ev)).catch(() => {}).finally(() => { if (box) box.remove(); });
    return drawing;
  }

  function draw(ev) {
    if (page === "sessions") return storedOnList(ev);
    if (ev.session_id === sessionId) return storedOnSession(ev);
  }

  async function fetchText(url) {
    const r = await fetch(url, { credentials: "same-origin" });
    return r.ok ? r.text() : null;
  }

  async function storedOnList(ev) {
    const tbody = document.getElementById("session-rows");
    const existing = tbody.querySelector('tr[data-session="' + CSS.escape(ev.session_id) + '"]');
    // A filtered or older page would be wrong to reorder: only say there is news.
    if (window.location.search && !existing) return notice();
    const html = await fetchText("/_tooltap/fragments/session-row/" + encodeURIComponent(ev.session_id));
    const row = html && parse(html, "tr");
    if (!row) return;
    row.classList.add("fresh");
    if (existing) existing.remove();
    else countNewSession();
    const empty = tbody.querySelector("tr.empty");
    if (empty) empty.remove();
    tbody.prepend(row);
  }

  function countNewSession() {
    const total = document.getElementById("sessions-total");
    if (!total) return;
    total.dataset.total = String(Number(total.dataset.total) + 1);
    total.textContent = Number(total.dataset.total).toLocaleString("en-US");
  }

  async function storedOnSession(ev) {
    const [html, headHtml] = await Promise.all([
      fetchText("/_tooltap/fragments/turn/" + encodeURIComponent(ev.turn_id)),
      // The header's totals, times and chart, as they stand with this turn.
      fetchText("/_tooltap/fragments/session-head/" + encodeURIComponent(ev.session_id)),
    ]);
    const head = headHtml && parse(headHtml, "section");
    const oldHead = document.getElementById("session-head");
    if (head && oldHead) {
      oldHead.replaceWith(head);
      followHead(head);
    }
    const card = html && parse(html, "article");
    if (!card) return;
    card.classList.add("fresh");
    const existing = document.getElementById("turn-" + ev.turn_id);
    if (existing) existing.replaceWith(card);
    // With later turns not fetched yet, the new one comes with them, in its place.
    else if (!document.getElementById("more-turns")) document.getElementById("turns").append(card);
  }

  // What the page shows of the session outside its header: the tab's title and, on a page
  // that starts at a later turn, "From turn X of N".
  function followHead(head) {
    if (head.dataset.pageTitle) document.title = head.dataset.pageTitle;
    const of = document.getElementById("turns-of");
    if (of && head.dataset.turns) of.textContent = head.dataset.turns;
  }

  function notice() {
    if (document.getElementById("news")) return;
    const n = el("p", "note", "New activity. ");
    n.id = "news";
    const a = el("a", null, "Reload");
    a.href = window.location.href;
    n.append(a);
    container().before(n);
  }

  function handler(fn) {
    return (msg) => {
      let ev;
      try { ev = JSON.parse(msg.data); } catch (_) { return; }
      fn(ev);
    };
  }

  const source = new EventSource("/_tooltap/api/live");
  source.addEventListener("hello", () => { dot.classList.add("on"); document.body.dataset.live = "on"; });
  source.addEventListener("turn_started", handler(started));
  source.addEventListener("turn_growing", handler(growing));
  source.addEventListener("turn_finished", handler(finished));
  source.addEventListener("turn_stored", handler(stored));
  source.onerror = () => { dot.classList.remove("on"); document.body.dataset.live = "off"; };
})();
