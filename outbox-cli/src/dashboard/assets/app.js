// The dashboard's only script: refreshes the overview's live part in place
// (the same page, fetched again and parsed; everything in it was escaped by
// the server), paused while the tab is hidden.
(function () {
  "use strict";
  const live = document.getElementById("live");
  if (!live) return;
  const seconds = Number(live.dataset.refreshSeconds || "5");
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
      }
    } catch (_) {
      // The next refresh tries again; the page keeps what it shows.
    }
  }
  window.setInterval(refresh, seconds * 1000);
})();
