package tasks

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.temporal.io/api/serviceerror"
)

func TestStartMayLand(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("tasks: start: %w", context.DeadlineExceeded), true},
		{context.Canceled, true},
		{serviceerror.NewDeadlineExceeded("slow"), true},
		{serviceerror.NewCanceled("gone"), true},
		{fmt.Errorf("tasks: start: %w", serviceerror.NewUnavailable("connection reset")), true},
		{serviceerror.NewInvalidArgument("bad input"), false},
		{serviceerror.NewWorkflowExecutionAlreadyStarted("exists", "", ""), false},
		{serviceerror.NewNamespaceNotFound("default"), false},
		{errors.New("boom"), false},
	} {
		if got := StartMayLand(tc.err); got != tc.want {
			t.Errorf("StartMayLand(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
