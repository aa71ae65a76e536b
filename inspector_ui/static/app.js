// Keyboard navigation, help and copy buttons. No captured text is ever parsed as HTML
// here: only textContent is read or written.
"use strict";

(function () {
  let current = -1;

  function items() {
    return Array.from(document.querySelectorAll(".nav-item"));
  }

  function select(i) {
    const list = items();
    if (!list.length) return;
    current = Math.max(0, Math.min(i, list.length - 1));
    list.forEach((el, n) => el.classList.toggle("selected", n === current));
    list[current].scrollIntoView({ block: "nearest" });
    if (list[current].tagName === "ARTICLE") list[current].scrollIntoView({ block: "start" });
  }

  function open() {
    const el = items()[current];
    if (el && el.dataset.href) window.location.href = el.dataset.href;
  }

  function toggleDetails() {
    const el = items()[current];
    if (!el) return;
    const all = Array.from(el.querySelectorAll("details"));
    const anyClosed = all.some((d) => !d.open);
    all.forEach((d) => { d.open = anyClosed; });
  }

  function typing(e) {
    const t = e.target;
    return t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.tagName === "SELECT" || t.isContentEditable);
  }

  document.addEventListener("keydown", (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (typing(e)) {
      if (e.key === "Escape") e.target.blur();
      return;
    }
    const help = document.getElementById("help");
    switch (e.key) {
      case "j": select(current + 1); break;
      case "k": select(current - 1); break;
      case "Enter": open(); break;
      case "o": toggleDetails(); break;
      case "g": window.location.href = "/_tooltap/"; break;
      case "/": {
        const s = document.getElementById("search");
        if (s) { e.preventDefault(); s.focus(); s.select(); }
        else window.location.href = "/_tooltap/#search";  // search is on the sessions page
        break;
      }
      case "?": if (help) help.hidden = !help.hidden; break;
      case "Escape": if (help) help.hidden = true; break;
      default: return;
    }
  });

  if (location.hash === "#search") {  // come from "/" on another page
    const s = document.getElementById("search");
    if (s) s.focus();
  }

  document.addEventListener("click", (e) => {
    const btn = e.target.closest("button.copy");
    if (btn) {
      const src = document.getElementById(btn.dataset.copy);
      if (src && navigator.clipboard) {
        navigator.clipboard.writeText(src.textContent).then(
          () => { btn.textContent = "copied"; },
          () => { btn.textContent = "copy failed: select the text below"; });
      }
      return;
    }
    if (e.target.id === "help-btn") {
      const help = document.getElementById("help");
      help.hidden = !help.hidden;
      return;
    }
    // A click on a row (not on a link in it) opens it, like Enter.
    const row = e.target.closest("tr.nav-item");
    if (row && !e.target.closest("a") && row.dataset.href) window.location.href = row.dataset.href;
  });
})();
