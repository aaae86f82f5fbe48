// Countersign approver pages: passkey enrollment and approval.
// Plain browser JavaScript, no build step. The pages are server-rendered; this
// file only drives the WebAuthn ceremonies. It reads the enrollment token or
// approval reference from the URL, never from the page.
"use strict";

(function () {
  // A registration challenge lives 5 minutes on the server; refetch before.
  const ENROLL_OPTIONS_FRESH_MS = 4 * 60 * 1000;

  const MESSAGES = {
    no_pending_enrollment: "This invitation is no longer valid: it was already used, it expired, or the link is incomplete. Ask your administrator for a new one.",
    credential_already_enrolled: "This passkey is already set up.",
    verification_failed: "Your passkey could not be verified. Try again, or use another device.",
    task_not_pending: "This request is no longer waiting for a decision: it was decided, expired or withdrawn.",
    no_eligible_credential: "No passkey enrolled here may approve this request. Ask your administrator.",
    challenge_unknown: "The confirmation was not recognised. Reload the page and try again.",
    challenge_consumed: "That confirmation was already used, so it was refused and nothing changed. Tap the button to confirm afresh.",
    challenge_expired: "The confirmation took too long. Try again.",
    challenge_wrong_task: "The confirmation belongs to another request. Reload the page.",
    challenge_wrong_tool: "The confirmation belongs to another request. Reload the page.",
    challenge_wrong_decision: "The confirmation was for the other button. Try again.",
    verification_unavailable: "Your decision could not be checked just now. Try again.",
    unknown_credential: "This passkey is not enrolled here. Use the passkey you set up from your invitation.",
    authenticator_class_mismatch: "This request needs a different kind of passkey, such as a security key.",
    signature_verification_failed: "Your passkey's signature could not be verified. Use the passkey you set up from your invitation.",
    signature_counter_regression: "This passkey was refused because it may have been copied. Contact your administrator.",
    argument_hash_mismatch: "The request does not match what was confirmed. Reload the page.",
    approver_not_eligible: "Your passkey is not one of the approvers for this request. Nothing changed.",
    self_approval: "You cannot decide on a request you made yourself. Another approver has to.",
    already_approved: "You have already approved this request. It is waiting for other approvers.",
    missing_evidence: "The passkey response was incomplete. Try again.",
    not_found: "This link is not valid. Open it exactly as you received it.",
    cross_origin_request: "Open the link exactly as you received it.",
  };

  // Rejections that end what this approver can do here, each with a title
  // for the outcome panel.
  const TITLES = {
    task_not_pending: "No longer waiting",
    challenge_expired: "Confirmation expired",
    challenge_consumed: "Already used",
    approver_not_eligible: "Not eligible",
    self_approval: "You made this request",
    already_approved: "Already decided",
    unknown_credential: "Passkey not recognised",
    signature_verification_failed: "Passkey not recognised",
    signature_counter_regression: "Passkey refused",
    no_eligible_credential: "No eligible passkey",
    argument_hash_mismatch: "Request changed",
  };
  const FINAL = ["task_not_pending", "already_approved", "self_approval", "approver_not_eligible", "no_eligible_credential"];

  const STATE_LABELS = {
    pending: "Waiting for approval",
    approved: "Approved, running now",
    executed: "Approved and done",
    denied: "Denied",
    expired: "Expired",
    cancelled: "Cancelled",
    failed: "Approved, but it failed",
  };

  // ---- helpers -------------------------------------------------------------

  function $(id) {
    return document.getElementById(id);
  }

  // show writes a status panel: an optional bold title, then the text.
  function show(el, kind, text, title) {
    el.className = "status" + (kind ? " status-" + kind : "");
    el.textContent = "";
    if (title) {
      const t = document.createElement("p");
      t.className = "status-title";
      t.textContent = title;
      el.appendChild(t);
    }
    if (text) {
      const p = document.createElement("p");
      p.textContent = text;
      el.appendChild(p);
    }
  }

  function setBusy(button, on) {
    if (!button) return;
    if (on) button.setAttribute("aria-busy", "true");
    else button.removeAttribute("aria-busy");
  }

  // Times are rendered in UTC by the server; show them in local time.
  function localTimes(root) {
    (root || document).querySelectorAll("time.step-time[datetime]").forEach(function (el) {
      const d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) return;
      el.textContent = d.toLocaleString(undefined, { day: "numeric", month: "short", hour: "2-digit", minute: "2-digit", second: "2-digit" });
      el.title = d.toString();
    });
  }

  async function getJSON(url) {
    const res = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-store" });
    let data = {};
    try {
      data = (await res.json()) || {};
    } catch (e) {
      data = {};
    }
    return { ok: res.ok, status: res.status, data: data };
  }

  function b64uToBuf(s) {
    const b64 = s.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((s.length + 3) % 4);
    const bin = atob(b64);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out.buffer;
  }

  function bufToB64u(buf) {
    const bytes = new Uint8Array(buf);
    let bin = "";
    for (let i = 0; i < bytes.length; i++) bin += String.fromCharCode(bytes[i]);
    return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function withBufferIds(list) {
    return (list || []).map(function (c) {
      return Object.assign({}, c, { id: b64uToBuf(c.id) });
    });
  }

  // The server's options, base64url fields turned into ArrayBuffers.
  function creationOptions(options) {
    const pk = Object.assign({}, options.publicKey);
    pk.challenge = b64uToBuf(pk.challenge);
    pk.user = Object.assign({}, pk.user, { id: b64uToBuf(pk.user.id) });
    pk.excludeCredentials = withBufferIds(pk.excludeCredentials);
    return pk;
  }

  function requestOptions(options) {
    const pk = Object.assign({}, options);
    pk.challenge = b64uToBuf(pk.challenge);
    pk.allowCredentials = withBufferIds(pk.allowCredentials);
    return pk;
  }

  // The PublicKeyCredential as JSON, ArrayBuffers as base64url.
  function credentialJSON(cred) {
    const r = cred.response;
    const out = {
      id: cred.id,
      rawId: bufToB64u(cred.rawId),
      type: cred.type,
      clientExtensionResults: cred.getClientExtensionResults ? cred.getClientExtensionResults() : {},
      response: { clientDataJSON: bufToB64u(r.clientDataJSON) },
    };
    if (cred.authenticatorAttachment) out.authenticatorAttachment = cred.authenticatorAttachment;
    if (r.attestationObject) {
      out.response.attestationObject = bufToB64u(r.attestationObject);
      if (r.getTransports) out.response.transports = r.getTransports();
    } else {
      out.response.authenticatorData = bufToB64u(r.authenticatorData);
      out.response.signature = bufToB64u(r.signature);
      if (r.userHandle) out.response.userHandle = bufToB64u(r.userHandle);
    }
    return out;
  }

  // POST JSON; resolves to {ok, status, data}; rejects only on network failure.
  async function post(url, body) {
    const res = await fetch(url, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify(body || {}),
      credentials: "same-origin",
      cache: "no-store",
    });
    let data = {};
    try {
      data = (await res.json()) || {};
    } catch (e) {
      data = {};
    }
    return { ok: res.ok, status: res.status, data: data };
  }

  function explain(data, status) {
    return MESSAGES[data.reason || data.error] || data.message || "Something went wrong (HTTP " + status + "). Try again.";
  }

  function webauthnMessage(err) {
    switch (err && err.name) {
      case "NotAllowedError":
        return "The passkey prompt was closed or timed out.";
      case "InvalidStateError":
        return "This device already holds a passkey for you here.";
      case "SecurityError":
        return "Passkeys do not work at this address. Open the link exactly as you received it.";
      case "NotSupportedError":
        return "This device cannot create a suitable passkey.";
      case "AbortError":
        return "The passkey prompt was cancelled.";
    }
    return "The passkey step failed" + (err && err.name ? " (" + err.name + ")" : "") + ".";
  }

  function passkeysSupported() {
    return !!(window.PublicKeyCredential && navigator.credentials && window.isSecureContext);
  }

  function pathPart(i) {
    return decodeURIComponent(location.pathname.split("/")[i] || "");
  }

  // ---- enrollment page -----------------------------------------------------

  function enrollPage() {
    const button = $("enroll");
    const status = $("status");
    const who = $("who");
    const done = $("done");
    const inboxLink = $("inbox-link");
    const api = "/approver/v1/enrollments/" + encodeURIComponent(pathPart(2));
    let options = null;
    let fetchedAt = 0;
    let approverId = "";

    if (!passkeysSupported()) {
      show(status, "error", "This browser cannot use passkeys. Open the link in an up-to-date browser on your phone.", "Passkeys unavailable");
      return;
    }

    // Fetch the options up front so that the tap goes straight to the
    // passkey prompt (some browsers refuse it after a slow network call).
    async function begin() {
      const res = await post(api + "/begin");
      if (!res.ok) {
        show(status, "error", explain(res.data, res.status), "Invitation not usable");
        return false;
      }
      options = res.data.options;
      fetchedAt = Date.now();
      const user = options && options.publicKey && options.publicKey.user;
      if (user && (user.displayName || user.name)) {
        who.textContent = "Welcome, " + (user.displayName || user.name) + ".";
        who.hidden = false;
      }
      if (user && user.id) {
        try {
          approverId = new TextDecoder().decode(b64uToBuf(user.id));
        } catch (e) {
          approverId = "";
        }
      }
      return true;
    }

    async function enroll() {
      button.disabled = true;
      setBusy(button, true);
      try {
        if (!options || Date.now() - fetchedAt > ENROLL_OPTIONS_FRESH_MS) {
          show(status, "info", "Preparing…");
          if (!(await begin())) return;
        }
        show(status, "info", "Follow your device's prompt…");
        let cred;
        try {
          cred = await navigator.credentials.create({ publicKey: creationOptions(options) });
        } catch (e) {
          show(status, "error", webauthnMessage(e) + " Tap the button to try again.", "No passkey created");
          button.disabled = false;
          return;
        }
        show(status, "info", "Saving your passkey…");
        const res = await post(api + "/finish", { response: credentialJSON(cred) });
        options = null; // one registration challenge, one attempt
        if (!res.ok) {
          show(status, "error", explain(res.data, res.status), "Passkey not saved");
          button.disabled = res.data.error === "no_pending_enrollment";
          return;
        }
        button.hidden = true;
        show(status, "ok", "You can now approve requests from this device. Approval requests will link you back here.", "Your passkey is set up");
        if (/^[0-9a-f]{32}$/.test(approverId)) {
          inboxLink.href = "/inbox/" + approverId;
          done.hidden = false;
        }
      } catch (e) {
        show(status, "error", "Check your connection and try again.", "Network error");
        button.disabled = false;
      } finally {
        setBusy(button, false);
      }
    }

    button.addEventListener("click", enroll);
    begin()
      .then(function (ok) {
        if (ok) {
          button.disabled = false;
          show(status, "", "");
        }
      })
      .catch(function () {
        show(status, "error", "Check your connection and reload the page.", "Network error");
      });
  }

  // ---- approval page -------------------------------------------------------

  function approvePage() {
    const status = $("status");
    const actions = $("actions");
    const denyPanel = $("deny-panel");
    const approveBtn = $("approve");
    const denyBtn = $("deny");
    const denyConfirm = $("deny-confirm");
    const denyCancel = $("deny-cancel");
    const comment = $("comment");
    const expires = $("expires");
    const buttons = [approveBtn, denyBtn, denyConfirm, denyCancel].filter(Boolean);
    const ref = pathPart(2);
    const api = "/approver/v1/approvals/" + encodeURIComponent(ref);
    const article = document.querySelector(".approval");
    let state = article ? article.dataset.state : "";
    // A challenge kept after a dismissed passkey prompt, reused by a retap.
    let held = null;
    let closed = !actions;
    let pollUntil = 0;

    localTimes();

    function busy(on, button) {
      buttons.forEach(function (b) {
        b.disabled = on || closed;
      });
      setBusy(button, on);
    }

    function close() {
      closed = true;
      if (actions) actions.hidden = true;
      if (denyPanel) denyPanel.hidden = true;
    }

    function openDeny(open) {
      if (!denyPanel || closed) return;
      denyPanel.hidden = !open;
      actions.hidden = open;
      denyBtn.setAttribute("aria-expanded", open ? "true" : "false");
      if (open) comment.focus();
      else denyBtn.focus();
    }

    // refresh re-reads the page and swaps in its live parts: the state
    // badge, the count, the identical calls, the outcome and the
    // timeline. The server renders them; this file never builds them
    // itself.
    async function refresh() {
      const res = await fetch(location.pathname, { credentials: "same-origin", cache: "no-store" });
      if (!res.ok) return;
      const doc = new DOMParser().parseFromString(await res.text(), "text/html");
      ["state", "facts", "identical", "outcome", "timeline"].forEach(function (id) {
        const now = $(id);
        const next = doc.getElementById(id);
        if (now && next) now.replaceWith(document.importNode(next, true));
      });
      localTimes();
      const a = doc.querySelector(".approval");
      if (a && a.dataset.state) {
        state = a.dataset.state;
        article.dataset.state = state;
        if (state !== "pending") close();
      }
    }

    // poll keeps the page current: quickly right after a decision, slowly
    // while the request waits for others.
    function poll() {
      const fast = Date.now() < pollUntil;
      const done = state !== "pending" && state !== "approved";
      if (done) return;
      setTimeout(
        function () {
          if (document.hidden && !fast) return poll();
          getJSON(api)
            .then(function (res) {
              if (res.ok && (res.data.status !== state || res.data.approved + " of " + res.data.needed !== ($("count") || {}).textContent)) {
                return refresh().then(function () {
                  if (state !== "pending" && state !== "approved") {
                    // The server's outcome panel now tells the end.
                    show(status, "", "");
                  }
                });
              }
            })
            .catch(function () {})
            .then(poll);
        },
        fast ? 700 : 5000
      );
    }

    function countdown() {
      if (!expires || closed) return;
      const end = Date.parse(expires.getAttribute("datetime"));
      function tick() {
        // refresh() may have swapped the element: look it up each time.
        const el = $("expires");
        if (!el) return;
        const left = end - Date.now();
        if (left <= 0) {
          el.textContent = "expired";
          if (!closed) {
            close();
            show(status, "error", "Not enough approvers decided in time. The call will not run.", "Expired");
            pollUntil = Date.now() + 15000;
          }
          return;
        }
        const m = Math.floor(left / 60000);
        const s = Math.floor((left % 60000) / 1000);
        if (m >= 48 * 60) el.textContent = Math.floor(m / 1440) + " days";
        else if (m >= 60) el.textContent = Math.floor(m / 60) + " h " + (m % 60) + " min";
        else if (m >= 5) el.textContent = m + " min";
        else el.textContent = m + " min " + String(s).padStart(2, "0") + " s";
        setTimeout(tick, m >= 5 ? 15000 : 1000);
      }
      tick();
    }

    async function decide(decision, button) {
      if (closed) return;
      if (!passkeysSupported()) {
        show(status, "error", "This browser cannot use passkeys. Open the link on the phone you enrolled.", "Passkeys unavailable");
        return;
      }
      busy(true, button);
      try {
        let ch = held && held.decision === decision && Date.now() < held.until ? held.challenge : null;
        held = null;
        if (!ch) {
          show(status, "info", "Preparing a confirmation…");
          const res = await post(api + "/challenge", { decision: decision });
          if (!res.ok) {
            const reason = res.data.error;
            show(status, "error", explain(res.data, res.status), TITLES[reason] || "Could not start");
            if (FINAL.indexOf(reason) >= 0) {
              close();
              refresh();
            }
            return;
          }
          ch = res.data;
        }
        show(status, "info", "Confirm with your passkey…");
        let cred;
        try {
          cred = await navigator.credentials.get({ publicKey: requestOptions(ch.requestOptions) });
        } catch (e) {
          held = { decision: decision, challenge: ch, until: Date.parse(ch.expiresAt) - 15000 };
          show(status, "error", webauthnMessage(e) + " Tap the button again to retry.", "Not confirmed");
          return;
        }
        show(status, "info", "Sending your decision…");
        const body = { challengeId: ch.challengeId, decision: decision, response: credentialJSON(cred) };
        const note = decision === "deny" && comment ? comment.value.trim() : "";
        if (note) body.comment = note;
        const res = await post(api + "/decision", body);
        const d = res.data;
        if (res.ok && d.accepted) {
          close();
          if (decision === "deny") show(status, "ok", "The call will not run. The agent is told it was denied.", "You denied this request");
          else if (d.status === "pending") show(status, "ok", "Waiting for more approvals: " + d.approved + " of " + d.needed + ".", "You approved");
          else show(status, "ok", "Policy is checked once more, then the call runs once.", "You approved");
          pollUntil = Date.now() + 30000;
          refresh();
          return;
        }
        const reason = d.reason || d.error;
        show(status, "error", explain(d, res.status), TITLES[reason] || "Decision refused");
        if (FINAL.indexOf(reason) >= 0) {
          close();
          refresh();
        }
      } catch (e) {
        show(status, "error", "Check your connection and try again.", "Network error");
      } finally {
        busy(false, button);
      }
    }

    if (approveBtn) {
      approveBtn.addEventListener("click", function () {
        decide("approve", approveBtn);
      });
      denyBtn.addEventListener("click", function () {
        openDeny(true);
      });
      denyCancel.addEventListener("click", function () {
        openDeny(false);
      });
      denyConfirm.addEventListener("click", function () {
        decide("deny", denyConfirm);
      });
    }
    countdown();
    poll();
  }

  // ---- inbox page ----------------------------------------------------------

  function inboxPage() {
    const button = $("inbox-open");
    const status = $("status");
    const list = $("inbox-list");
    const empty = $("inbox-empty");
    const api = "/approver/v1/inbox/" + encodeURIComponent(pathPart(2));

    function item(a) {
      const li = document.createElement("li");
      const link = document.createElement("a");
      link.href = a.url;
      const title = document.createElement("span");
      title.className = "item-title";
      title.textContent = a.displayText;
      const meta = document.createElement("span");
      meta.className = "item-meta";
      const left = Date.parse(a.expiresAt) - Date.now();
      const parts = [
        ["tool", a.tool],
        ["", "by " + a.requester],
        ["", a.approved + " of " + a.needed + " approvals"],
        ["", left > 3600000 ? Math.floor(left / 3600000) + " h left" : Math.max(0, Math.floor(left / 60000)) + " min left"],
      ];
      parts.forEach(function (p) {
        const s = document.createElement("span");
        if (p[0]) s.className = p[0];
        s.textContent = p[1];
        meta.appendChild(s);
      });
      link.appendChild(title);
      link.appendChild(meta);
      li.appendChild(link);
      return li;
    }

    async function open() {
      if (!passkeysSupported()) {
        show(status, "error", "This browser cannot use passkeys. Open the link on the phone you enrolled.", "Passkeys unavailable");
        return;
      }
      button.disabled = true;
      setBusy(button, true);
      try {
        show(status, "info", "Preparing a confirmation…");
        let res = await post(api + "/challenge", {});
        if (!res.ok) {
          show(status, "error", explain(res.data, res.status), TITLES[res.data.error] || "Could not start");
          return;
        }
        const ch = res.data;
        show(status, "info", "Confirm with your passkey…");
        let cred;
        try {
          cred = await navigator.credentials.get({ publicKey: requestOptions(ch.requestOptions) });
        } catch (e) {
          show(status, "error", webauthnMessage(e) + " Tap the button again to retry.", "Not confirmed");
          return;
        }
        res = await post(api + "/list", { challengeId: ch.challengeId, response: credentialJSON(cred) });
        if (!res.ok) {
          show(status, "error", explain(res.data, res.status), TITLES[res.data.error] || "Could not list your approvals");
          return;
        }
        const items = res.data.approvals || [];
        list.textContent = "";
        items.forEach(function (a) {
          list.appendChild(item(a));
        });
        list.hidden = items.length === 0;
        empty.hidden = items.length !== 0;
        const n = items.length;
        show(status, "ok", n === 0 ? "" : "Open one to review it and decide.", n === 1 ? "1 request waits for " + res.data.approver : n + " requests wait for " + res.data.approver);
        button.textContent = "Refresh";
      } catch (e) {
        show(status, "error", "Check your connection and try again.", "Network error");
      } finally {
        button.disabled = false;
        setBusy(button, false);
      }
    }

    button.addEventListener("click", open);
  }

  const pages = { enroll: enrollPage, approve: approvePage, inbox: inboxPage };
  const run = pages[document.body.dataset.page];
  if (run) run();
})();
