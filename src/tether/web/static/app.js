// The run page's live feed: entries journaled elsewhere appear at the top of the timeline, without a
// reload (server-sent events from store.follow). The rows arrive as HTML the server rendered and escaped.
(function () {
  "use strict";
  var panels = document.getElementById("panels");
  var timeline = document.getElementById("timeline");
  if (!panels || !timeline || !window.EventSource) return;
  var live = document.getElementById("live");
  var url = panels.dataset.events + "?after=" + encodeURIComponent(panels.dataset.after);
  var source = new EventSource(url);
  var pending = null;
  source.addEventListener("entry", function (event) {
    var data = JSON.parse(event.data);
    if (timeline.querySelector('tr[data-seq="' + data.seq + '"]')) return;
    timeline.insertAdjacentHTML("afterbegin", data.html);
    var row = timeline.firstElementChild;
    if (row) row.classList.add("fresh");
  });
  source.addEventListener("refresh", function () {
    if (pending) clearTimeout(pending);
    pending = setTimeout(function () {
      pending = null;
      // Do not wipe a decision being typed: refresh the panels only when no field of theirs has focus.
      if (panels.contains(document.activeElement) && document.activeElement.tagName !== "BODY") return;
      document.body.dispatchEvent(new CustomEvent("tether:refresh"));
    }, 150);
  });
  source.addEventListener("end", function () {
    source.close();
    if (live) { live.textContent = "finished"; live.classList.add("done"); }
  });
  source.onerror = function () {
    if (live && source.readyState === EventSource.CLOSED) live.textContent = "disconnected";
  };
})();
