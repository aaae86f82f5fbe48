package tasks_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/tasks"
)

func TestApprovalInputNormalized(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	later := at.Add(time.Hour)
	tests := []struct {
		name string
		in   tasks.ApprovalInput
		want tasks.ApprovalInput
	}{
		{
			name: "previous unattended shape: quorum 0, no group, ExpiresAt is the start",
			in:   tasks.ApprovalInput{Requirement: tasks.Requirement{TTL: time.Second}, ExpiresAt: at},
			want: tasks.ApprovalInput{Requirement: tasks.Requirement{TTL: time.Second}, ExpiresAt: at, Mode: tasks.ModeUnattended, StartAt: at},
		},
		{
			name: "previous approval shape",
			in:   tasks.ApprovalInput{Requirement: tasks.Requirement{Group: "g", Quorum: 2}, ExpiresAt: at},
			want: tasks.ApprovalInput{Requirement: tasks.Requirement{Group: "g", Quorum: 2}, ExpiresAt: at, Mode: tasks.ModeApproval},
		},
		{
			name: "previous shape, quorum 0 with a group stays an (invalid) approval",
			in:   tasks.ApprovalInput{Requirement: tasks.Requirement{Group: "g"}, ExpiresAt: at},
			want: tasks.ApprovalInput{Requirement: tasks.Requirement{Group: "g"}, ExpiresAt: at, Mode: tasks.ModeApproval},
		},
		{
			name: "explicit unattended keeps its start",
			in:   tasks.ApprovalInput{Mode: tasks.ModeUnattended, ExpiresAt: at, StartAt: later},
			want: tasks.ApprovalInput{Mode: tasks.ModeUnattended, ExpiresAt: at, StartAt: later},
		},
		{
			name: "explicit approval is not reinterpreted, even with quorum 0",
			in:   tasks.ApprovalInput{Mode: tasks.ModeApproval, ExpiresAt: at},
			want: tasks.ApprovalInput{Mode: tasks.ModeApproval, ExpiresAt: at},
		},
		{
			name: "unknown mode is kept for validation to reject",
			in:   tasks.ApprovalInput{Mode: "other", ExpiresAt: at},
			want: tasks.ApprovalInput{Mode: "other", ExpiresAt: at},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, tt.in.Normalized()); diff != "" {
				t.Errorf("Normalized() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
