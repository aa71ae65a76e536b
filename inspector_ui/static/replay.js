// The session page's replay button: a POST with our own header (a page from another
// site cannot send it), then the stored run is shown. Only textContent is written.
"use strict";

(function () {
  document.addEventListener("click", async (e) => {
    const btn = e.target.closest("button[data-replay]");
    if (!btn) return;
    const state = document.getElementById("replay-state");
    btn.disabled = true;
    state.classList.remove("bad");
    state.textContent = "replaying…";
    let answer = null;
    let failure = "";
    try {
      const r = await fetch(btn.dataset.replay, {
        method: "POST",
        credentials: "same-origin",
        headers: { "X-Tooltap-Action": "replay", "Accept": "application/json" },
      });
      answer = await r.json().catch(() => null);
      if (!r.ok) failure = (answer && answer.detail) || "replay failed (HTTP " + r.status + ")";
    } catch (err) {
      failure = "replay failed: " + err;
    }
    if (!failure && answer && answer.location) {
      window.location.href = answer.location;
      return;
    }
    state.classList.add("bad");
    state.textContent = failure || "replay failed";
    btn.disabled = false;
  });
})();
