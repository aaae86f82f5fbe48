package passkey_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"

	"github.com/descope/virtualwebauthn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/natsrv"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/passkey"
)

// Example walks one approver from invite to a verified approval, with a
// virtual authenticator standing in for the phone.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "passkey-example")
	defer os.RemoveAll(dir)
	srv, err := natsrv.Start(natsrv.Options{StoreDir: dir})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.URL())
	defer nc.Close()
	js, _ := jetstream.New(nc)

	svc, err := passkey.New(ctx, js, passkey.Options{RPID: "example.com", RPOrigins: []string{"https://approvals.example.com"}})
	if err != nil {
		log.Fatal(err)
	}
	browser := virtualwebauthn.RelyingParty{ID: "example.com", Origin: "https://approvals.example.com"}

	// An admin adds Alice; she opens the invite link and enrolls a passkey.
	alice, token, _ := svc.AddApprover(ctx, "alice", []string{"finance"})
	phone := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(alice.ID)})
	key := testpasskey.NewEC2Credential() // a virtual P-256 passkey (see internal/testpasskey)
	creation, _ := svc.BeginEnrollment(ctx, token)
	creationJSON, _ := json.Marshal(creation)
	attOpts, _ := virtualwebauthn.ParseAttestationOptions(string(creationJSON))
	if _, err := svc.FinishEnrollment(ctx, token, []byte(virtualwebauthn.CreateAttestationResponse(browser, phone, key, *attOpts))); err != nil {
		log.Fatal(err)
	}

	// An agent's call is held; the workflow issues a challenge bound to it.
	hash, _ := canon.Hash("wire_transfer", []byte(`{"amount":100,"to":"ACME"}`), "https://countersign.example.com")
	ch, err := svc.IssueChallenge(ctx, passkey.ChallengeRequest{
		TaskID: "task-123", Tool: "wire_transfer", ActionHash: hash,
		Group: "finance", AuthenticatorClass: passkey.ClassPlatform, DisplayText: "Transfer 100 to ACME",
	})
	if err != nil {
		log.Fatal(err)
	}

	// Alice reviews the display text and signs on her phone.
	optsJSON, _ := json.Marshal(ch.RequestOptions)
	asOpts, _ := virtualwebauthn.ParseAssertionOptions(string(optsJSON))
	key.Counter++
	assertion := virtualwebauthn.CreateAssertionResponse(browser, phone, key, *asOpts)

	req := passkey.VerifyRequest{
		ChallengeID: ch.ID, TaskID: "task-123", Tool: "wire_transfer", ActionHash: hash,
		Group: "finance", AuthenticatorClass: passkey.ClassPlatform, Requester: "agent-7",
		ConsumerKey: "task-123/approval-1", Response: json.RawMessage(assertion),
	}
	v, err := svc.Verify(ctx, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("approved by", v.ApproverName)

	// The same assertion cannot approve anything else.
	req.ConsumerKey = "someone-else"
	_, err = svc.Verify(ctx, req)
	fmt.Println("replay:", passkey.ReasonOf(err))
	// Output:
	// approved by alice
	// replay: challenge_consumed
}
