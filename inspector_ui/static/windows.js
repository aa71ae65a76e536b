// A long session's page holds its first turns; the #more-turns marker at the end names
// the next window. It is fetched when the marker comes near the screen, and at once,
// window after window, when the address (#turn-N, a chart bar) names a turn not drawn
// yet. The cards come from the same autoescaped templates as the page and are parsed
// with DOMParser, which runs no script (as live.js does).
"use strict";

(function () {
  if (!document.getElementById("turns")) return;
  let pending = null;

  function fetchNext() {
    const marker = document.getElementById("more-turns");
    if (!marker) return Promise.resolve(false);
    if (!pending) {
      pending = fetch(marker.dataset.next, { credentials: "same-origin" })
        .then((r) => (r.ok ? r.text() : null))
        .then((html) => {
          if (html === null) return false;
          const doc = new DOMParser().parseFromString(html, "text/html");
          marker.replaceWith(...Array.from(doc.body.childNodes).map((n) => document.adoptNode(n)));
          watch();
          return true;
        })
        .finally(() => { pending = null; });
    }
    return pending;
  }

  async function show(hash) {
    const m = /^#turn-(\d+)$/.exec(hash || "");
    if (!m) return;
    while (!document.getElementById("turn-" + m[1])) {
      if (!(await fetchNext())) return;
    }
    document.getElementById("turn-" + m[1]).scrollIntoView({ block: "start" });
  }

  const seen = new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting)) fetchNext();
  }, { rootMargin: "1500px 0px" });

  function watch() {
    seen.disconnect();
    const marker = document.getElementById("more-turns");
    if (marker) seen.observe(marker);
  }

  window.addEventListener("hashchange", () => show(window.location.hash));
  watch();
  show(window.location.hash);
})();
