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
    task_not_pending: "This request is no longer waiting for a decision.",
    no_eligible_credential: "No passkey enrolled here may approve this request. Ask your administrator.",
    challenge_unknown: "The confirmation was not recognised. Reload the page and try again.",
    challenge_consumed: "That confirmation was already used. Try again.",
    challenge_expired: "The confirmation took too long. Try again.",
    challenge_wrong_task: "The confirmation belongs to another request. Reload the page.",
    challenge_wrong_tool: "The confirmation belongs to another request. Reload the page.",
    challenge_wrong_decision: "The confirmation was for the other button. Try again.",
    verification_unavailable: "Your decision could not be checked just now. Try again.",
    unknown_credential: "This passkey is not enrolled here.",
    authenticator_class_mismatch: "This request needs a different kind of passkey, such as a security key.",
    signature_verification_failed: "Your passkey's signature could not be verified.",
    signature_counter_regression: "This passkey was refused because it may have been copied. Contact your administrator.",
    argument_hash_mismatch: "The request does not match what was confirmed. Reload the page.",
    approver_not_eligible: "You are not one of the approvers for this request.",
    self_approval: "You cannot approve a request you made yourself.",
    already_approved: "You have already decided on this request.",
    missing_evidence: "The passkey response was incomplete. Try again.",
    cross_origin_request: "Open the link exactly as you received it.",
  };

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

  function show(el, kind, text) {
    el.className = "status" + (kind ? " status-" + kind : "");
    el.textContent = text;
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
    const api = "/approver/v1/enrollments/" + encodeURIComponent(pathPart(2));
    let options = null;
    let fetchedAt = 0;

    if (!passkeysSupported()) {
      show(status, "error", "This browser cannot use passkeys. Open the link in an up-to-date browser on your phone.");
      return;
    }

    // Fetch the options up front so that the tap goes straight to the
    // passkey prompt (some browsers refuse it after a slow network call).
    async function begin() {
      const res = await post(api + "/begin");
      if (!res.ok) {
        show(status, "error", explain(res.data, res.status));
        return false;
      }
      options = res.data.options;
      fetchedAt = Date.now();
      const user = options && options.publicKey && options.publicKey.user;
      if (user && (user.displayName || user.name)) {
        who.textContent = "For " + (user.displayName || user.name) + ".";
        who.hidden = false;
      }
      return true;
    }

    async function enroll() {
      button.disabled = true;
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
          show(status, "error", webauthnMessage(e) + " Tap the button to try again.");
          button.disabled = false;
          return;
        }
        show(status, "info", "Saving your passkey…");
        const res = await post(api + "/finish", { response: credentialJSON(cred) });
        options = null; // one registration challenge, one attempt
        if (!res.ok) {
          show(status, "error", explain(res.data, res.status));
          button.disabled = res.data.error === "no_pending_enrollment";
          return;
        }
        button.hidden = true;
        show(status, "ok", "Your passkey is set up. You can close this page: approval requests will link you back here.");
      } catch (e) {
        show(status, "error", "Network error. Check your connection and try again.");
        button.disabled = false;
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
        show(status, "error", "Network error. Check your connection and reload the page.");
      });
  }

  // ---- approval page -------------------------------------------------------

  function approvePage() {
    const status = $("status");
    const actions = $("actions");
    const count = $("count");
    const state = $("state");
    const expires = $("expires");
    const comment = $("comment");
    const buttons = [$("approve"), $("deny")].filter(Boolean);
    const api = "/approver/v1/approvals/" + encodeURIComponent(pathPart(2));
    // A challenge kept after a dismissed passkey prompt, reused by a retap.
    let held = null;
    let closed = !actions;

    function busy(on) {
      buttons.forEach(function (b) {
        b.disabled = on || closed;
      });
    }

    function close() {
      closed = true;
      if (actions) actions.hidden = true;
    }

    function setState(s) {
      if (state && s && STATE_LABELS[s]) {
        state.textContent = STATE_LABELS[s];
        state.className = "badge state-" + s;
      }
    }

    function countdown() {
      if (!expires || closed) return;
      const end = Date.parse(expires.getAttribute("datetime"));
      function tick() {
        const left = end - Date.now();
        if (left <= 0) {
          expires.textContent = "expired";
          if (!closed) {
            close();
            setState("expired");
            show(status, "error", "This request expired before enough approvals.");
          }
          return;
        }
        const m = Math.floor(left / 60000);
        const s = Math.floor((left % 60000) / 1000);
        if (m >= 48 * 60) expires.textContent = Math.floor(m / 1440) + " days";
        else if (m >= 60) expires.textContent = Math.floor(m / 60) + " h " + (m % 60) + " min";
        else if (m >= 5) expires.textContent = m + " min";
        else expires.textContent = m + " min " + String(s).padStart(2, "0") + " s";
        setTimeout(tick, m >= 5 ? 15000 : 1000);
      }
      tick();
    }

    async function decide(decision) {
      if (closed) return;
      if (!passkeysSupported()) {
        show(status, "error", "This browser cannot use passkeys. Open the link on the phone you enrolled.");
        return;
      }
      busy(true);
      try {
        let ch = held && held.decision === decision && Date.now() < held.until ? held.challenge : null;
        held = null;
        if (!ch) {
          show(status, "info", "Preparing a confirmation…");
          const res = await post(api + "/challenge", { decision: decision });
          if (!res.ok) {
            show(status, "error", explain(res.data, res.status));
            if (res.data.error === "task_not_pending") close();
            busy(false);
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
          show(status, "error", webauthnMessage(e) + " Tap the button again to retry.");
          busy(false);
          return;
        }
        show(status, "info", "Sending your decision…");
        const body = { challengeId: ch.challengeId, decision: decision, response: credentialJSON(cred) };
        const note = comment ? comment.value.trim() : "";
        if (note) body.comment = note;
        const res = await post(api + "/decision", body);
        const d = res.data;
        if (count && typeof d.approved === "number" && typeof d.needed === "number") {
          count.textContent = d.approved + " of " + d.needed;
        }
        setState(d.status);
        if (res.ok && d.accepted) {
          close();
          if (decision === "deny") show(status, "ok", "Denied. The call will not run.");
          else if (d.status === "pending") show(status, "ok", "Approved. Waiting for more approvals (" + d.approved + " of " + d.needed + ").");
          else show(status, "ok", "Approved. Thank you.");
          busy(false);
          return;
        }
        show(status, "error", explain(d, res.status));
        if (d.reason === "task_not_pending" || d.reason === "already_approved" || d.reason === "self_approval" || d.reason === "approver_not_eligible") close();
        busy(false);
      } catch (e) {
        show(status, "error", "Network error. Check your connection and try again.");
        busy(false);
      }
    }

    buttons.forEach(function (b) {
      b.addEventListener("click", function () {
        decide(b.id === "approve" ? "approve" : "deny");
      });
    });
    countdown();
  }

  const pages = { enroll: enrollPage, approve: approvePage };
  const run = pages[document.body.dataset.page];
  if (run) run();
})();
