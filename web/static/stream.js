// Live view of one turn on the admin detail page: follows the request's SSE stream (AI SDK UI
// message stream), appends text as it arrives and shows the final status. The page is complete
// without this script; it only makes a running turn visible while it runs.
(function () {
  "use strict";
  var output = document.getElementById("tj-output");
  if (!output || !output.dataset.streamUrl || !window.EventSource) return;
  var live = document.getElementById("tj-live");
  var events = document.getElementById("tj-events");
  var badges = document.querySelectorAll("[data-status]");
  var errorField = document.querySelector("[data-error]");
  var source = new EventSource(output.dataset.streamUrl);

  function note(text) { if (live) live.textContent = text; }
  function line(text, css) {
    var item = document.createElement("li");
    item.textContent = text;
    if (css) item.className = css;
    events.appendChild(item);
  }
  function showStatus(status, error) {
    badges.forEach(function (badge) {
      badge.textContent = status;
      badge.className = "tj-status tj-status-" + status;
    });
    if (errorField && error) errorField.textContent = error;
    document.body.dataset.streamStatus = status;
    if (status !== "pending" && status !== "running") {
      document.querySelectorAll("[data-while-active]").forEach(function (element) {
        element.hidden = true;
      });
    }
  }
  var streaming = false;
  function streamingNow() {  // any content chunk: the turn runs (a page opened mid-turn
    if (streaming) return;    // resumes after its start chunk, so it never sees "start")
    streaming = true;
    showStatus("running");
    note("streaming…");
  }
  var handlers = {
    "text-delta": function (chunk) { output.textContent += chunk.delta; },
    "tool-input-available": function (chunk) { line("called " + chunk.toolName); },
    "error": function (chunk) { line(chunk.errorText, "tj-error-text"); },
    "data-think-status": function (chunk) { showStatus(chunk.data.status, chunk.data.error); }
  };

  source.onopen = function () { note("connected, waiting for the turn…"); };
  source.onmessage = function (message) {
    if (message.data === "[DONE]") {
      source.close();
      note(live ? live.dataset.reloadText : "");
      return;
    }
    var chunk = JSON.parse(message.data);
    if (chunk.type !== "data-think-status") streamingNow();
    var handle = handlers[chunk.type];
    if (handle) handle(chunk);
  };
  source.onerror = function () { note("connection lost, reconnecting…"); };
})();
