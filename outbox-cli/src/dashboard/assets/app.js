// The dashboard's only script: refreshes a page's live part in place (the
// overview's counts, a bulk action's progress: the same page, fetched again
// and parsed; everything in it was escaped by the server), paused while the
// tab is hidden, stopped once the fresh part no longer asks for refreshes.
(function () {
  "use strict";
  const live = document.getElementById("live");
  if (!live || !live.dataset.refreshSeconds) return;
  const seconds = Number(live.dataset.refreshSeconds);
  let timer = null;
  async function refresh() {
    if (document.hidden) return;
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin" });
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById("live");
      if (fresh) {
        live.replaceChildren(...fresh.childNodes);
        live.dataset.refreshedAt = String(Date.now());
        if (!fresh.dataset.refreshSeconds) window.clearInterval(timer);
      }
    } catch (_) {
      // The next refresh tries again; the page keeps what it shows.
    }
  }
  timer = window.setInterval(refresh, seconds * 1000);
})();
