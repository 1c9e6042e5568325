/* The soniq dashboard's live refresh (docs/admin.md, "The dashboard").
 *
 * Every data-refresh-seconds the page asks its live endpoint (data-live-url,
 * the same permission as the page) for the figures and each module's body,
 * drawn on the server by the page's own templates, and swaps the bodies in
 * place: no reload, no framework, nothing from another site, no inline code
 * (a Content-Security-Policy of script-src 'self' allows it). Polling stops
 * while the tab is hidden and resumes, at once, when it is shown again.
 * "updated hh:mm:ss" says when the figures were read; a failed fetch says so
 * and greys the figures out until the next one succeeds.
 */
(function () {
  "use strict";

  function start() {
    var root = document.getElementById("soniq-dashboard");
    var state = document.getElementById("soniq-live-state");
    var asOf = document.getElementById("soniq-as-of-time");
    if (!root || !state || !window.fetch) {
      return;
    }
    var url = root.getAttribute("data-live-url");
    var seconds = parseFloat(root.getAttribute("data-refresh-seconds")) || 5;
    var timer = null;
    var busy = false;

    function show(text, failed) {
      state.textContent = text;
      state.className = failed ? "failed" : "";
      root.className = failed ? "stale" : "";
    }

    function schedule() {
      window.clearTimeout(timer);
      timer = document.hidden ? null : window.setTimeout(refresh, seconds * 1000);
    }

    function apply(data) {
      var modules = data.modules || {};
      Object.keys(modules).forEach(function (id) {
        var element = document.getElementById(id);
        if (element && element.getAttribute("data-live-module") === id) {
          element.innerHTML = modules[id];
        }
      });
      asOf.textContent = data.as_of_text;
      show("live: updated " + data.updated_text, false);
      root.setAttribute("data-updated", data.as_of);
    }

    function failed(why) {
      var now = new Date();
      var at = [now.getHours(), now.getMinutes(), now.getSeconds()].map(function (n) {
        return (n < 10 ? "0" : "") + n;
      }).join(":");
      show("update failed at " + at + " (" + why + "): the figures are as of the time above; " +
           "retrying every " + seconds + " s", true);
    }

    function refresh() {
      if (busy || document.hidden) {
        schedule();
        return;
      }
      busy = true;
      window.fetch(url, {credentials: "same-origin", cache: "no-store",
                         headers: {"Accept": "application/json"}})
        .then(function (response) {
          var type = response.headers.get("Content-Type") || "";
          if (!response.ok) {
            throw new Error("HTTP " + response.status);
          }
          if (type.indexOf("application/json") !== 0) {
            throw new Error("not logged in any more? reload the page");
          }
          return response.json();
        })
        .then(apply)
        .catch(function (error) { failed(error.message || "network error"); })
        .then(function () { busy = false; schedule(); });
    }

    document.addEventListener("visibilitychange", function () {
      if (document.hidden) {
        window.clearTimeout(timer);
        timer = null;
      } else {
        refresh();
      }
    });
    show("live: refreshes every " + seconds + " s", false);
    schedule();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
}());
