// sbclaim console: progressive enhancement only; every page works without it.
// An action form's buttons are disabled once it is sent, so a slow redrive
// is not sent twice by an impatient second click.
"use strict";
document.addEventListener("submit", function (ev) {
  var form = ev.target;
  if (!(form instanceof HTMLFormElement) || !form.classList.contains("action")) {
    return;
  }
  form.querySelectorAll("button").forEach(function (b) {
    b.disabled = true;
    b.textContent = b.textContent + "…";
  });
  form.setAttribute("aria-busy", "true");
});
