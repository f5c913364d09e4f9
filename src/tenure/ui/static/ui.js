// tenure dashboard: local times, lease countdowns, live reload of the page's content.
// Hand-written, no build step, no dependency. Works without it (times stay in UTC).
(function () {
  "use strict";
  var body = document.body;
  var base = body.dataset.base || "";
  var keys = [];
  try { keys = JSON.parse(body.dataset.liveKeys || "[]"); } catch (e) { keys = []; }
  var loadedAt = Date.now();
  var refreshes = 0;

  function pad(n) { return (n < 10 ? "0" : "") + n; }
  // The browser's zone as a short label ("GMT+9", "CET", "UTC"): a local time is never shown
  // without it, so a reader in Tokyo does not take a New York job's slot for local noon.
  function zoneLabel(d) {
    try {
      var parts = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" }).formatToParts(d);
      for (var i = 0; i < parts.length; i++) {
        if (parts[i].type === "timeZoneName") { return parts[i].value; }
      }
    } catch (e) { /* no Intl: fall through */ }
    var off = -d.getTimezoneOffset();
    return "UTC" + (off >= 0 ? "+" : "-") + pad(Math.floor(Math.abs(off) / 60)) + ":" + pad(Math.abs(off) % 60);
  }
  function localText(d, withDate) {
    var t = pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
    if (!withDate) { return t; }
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + t + " " + zoneLabel(d);
  }

  // Times: shown in the browser's zone, UTC on hover (the title keeps the UTC text).
  function localTimes(root) {
    root.querySelectorAll(".zone-note").forEach(function (el) {
      el.textContent = "Times in your browser's zone (" + zoneLabel(new Date()) + "); UTC on hover.";
    });
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (!isNaN(d)) { el.textContent = localText(d, true); }
    });
    root.querySelectorAll("svg.timeline text.tick[data-t]").forEach(function (el) {
      var d = new Date(el.getAttribute("data-t"));
      var step = Number(el.getAttribute("data-step"));
      if (isNaN(d)) { return; }
      if (step >= 86400) {
        el.textContent = d.toLocaleDateString(undefined, { month: "short", day: "numeric" });
      } else {
        var t = localText(d, false);
        el.textContent = step >= 60 ? t.slice(0, 5) : t;
      }
    });
  }

  // Lease countdowns, from the seconds left when the page was rendered.
  function tick() {
    var gone = (Date.now() - loadedAt) / 1000;
    document.querySelectorAll(".countdown[data-left]").forEach(function (el) {
      var left = Number(el.getAttribute("data-left")) - gone;
      el.textContent = left > 0 ? left.toFixed(1) + "s left" : "expired";
      el.classList.toggle("expired", left <= 0);
    });
  }

  function setLive(state, text) {
    var el = document.getElementById("live");
    if (el) { el.dataset.state = state; el.textContent = text; }
    body.dataset.live = state;
  }

  // What the user is doing in the content's form fields: values typed but not yet submitted
  // (a field whose value differs from the one the server rendered), the focused field and
  // its caret. Returns a function that puts them back into the re-rendered content, found by
  // id or else by form field name: a job running every second must not empty the search box
  // or take the focus away while someone types.
  function keepInput(root) {
    function keyOf(el) {
      if (el.id) { return "#" + el.id; }
      return el.name ? el.tagName + "[" + el.name + "]" : null;
    }
    function find(where, key) {
      if (key.charAt(0) === "#") { return document.getElementById(key.slice(1)); }
      var tag = key.slice(0, key.indexOf("[")), name = key.slice(key.indexOf("[") + 1, -1);
      var found = null;
      where.querySelectorAll(tag + "[name]").forEach(function (el) {
        if (found === null && el.name === name) { found = el; }
      });
      return found;
    }
    var typed = [];
    root.querySelectorAll("input, select, textarea").forEach(function (el) {
      var key = keyOf(el);
      if (!key || el.type === "hidden") { return; }
      var changed = el.tagName === "SELECT"
        ? Array.prototype.some.call(el.options, function (o) { return o.selected !== o.defaultSelected; })
        : (el.type === "checkbox" || el.type === "radio" ? el.checked !== el.defaultChecked
           : el.value !== el.defaultValue);
      if (changed) { typed.push([key, el.type === "checkbox" || el.type === "radio" ? el.checked : el.value]); }
    });
    var active = document.activeElement;
    var focus = active && root.contains(active) ? keyOf(active) : null;
    var caret = null;
    try { if (focus && active.selectionStart !== undefined && active.selectionStart !== null) {
      caret = [active.selectionStart, active.selectionEnd];
    } } catch (e) { caret = null; }  // number and email inputs have no selection
    return function (fresh) {
      typed.forEach(function (t) {
        var el = find(fresh, t[0]);
        if (!el) { return; }
        if (el.type === "checkbox" || el.type === "radio") { el.checked = t[1]; } else { el.value = t[1]; }
      });
      if (focus) {
        var el = find(fresh, focus);
        if (el) {
          el.focus();
          if (caret) { try { el.setSelectionRange(caret[0], caret[1]); } catch (e) { /* no selection */ } }
        }
      }
    };
  }

  // Reload the page's content in place (no navigation, focus and scroll kept).
  // At most one reload per second: a busy schedule must not turn a page into a poller.
  var inflight = false, again = false, lastRefresh = 0, timer = null;
  function refresh() {
    if (inflight) { again = true; return; }
    var wait = lastRefresh + 1000 - Date.now();
    if (wait > 0) {
      if (timer === null) { timer = window.setTimeout(function () { timer = null; refresh(); }, wait); }
      return;
    }
    inflight = true;
    lastRefresh = Date.now();
    fetch(window.location.href, { headers: { "X-Tenure-Refresh": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("content");
        var main = document.getElementById("content");
        if (fresh && main) {
          var kept = keepInput(main);
          main.innerHTML = fresh.innerHTML;
          loadedAt = Date.now();
          localTimes(main);
          kept(main);
        }
        refreshes += 1;
        body.dataset.refreshes = String(refreshes);
      })
      .catch(function () { /* the next event or poll tries again */ })
      .then(function () {
        inflight = false;
        if (again) { again = false; refresh(); }
      });
  }

  var poller = null;
  function poll() {
    if (poller === null) {
      setLive("polling", "polling every 5s");
      poller = window.setInterval(refresh, 5000);
    }
  }

  function listen() {
    // No EventSource, or a server without streams (the dashboard under WSGI): poll.
    if (!window.EventSource || body.dataset.stream === "off") { poll(); return; }
    var url = base + "/events" + (keys.length ? "?" + keys.map(function (k) {
      return "key=" + encodeURIComponent(k);
    }).join("&") : "");
    var source = new EventSource(url);
    var failures = 0, broken = false;
    source.onopen = function () {
      // Catch up with what changed while not connected (after an error, or when the page
      // was rendered a while before its stream opened).
      if (broken || Date.now() - loadedAt > 1500) { refresh(); }
      failures = 0;
      broken = false;
      if (poller !== null) { window.clearInterval(poller); poller = null; }
      setLive("live", "live");
    };
    source.onmessage = function () { refresh(); };
    source.onerror = function () {
      failures += 1;
      broken = true;
      if (source.readyState === EventSource.CLOSED || failures >= 3) { poll(); }
      else { setLive("reconnecting", "reconnecting…"); }
    };
  }

  localTimes(document);
  window.setInterval(tick, 250);
  listen();
})();
