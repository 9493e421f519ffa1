package sharderr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/wireerr"
)

var errSample = wireerr.New(shardv1.ErrorCode_ERROR_CODE_PAYLOAD_CORRUPT, "test: sample refusal")

func TestFromSanitizes(t *testing.T) {
	cause := errors.New("/secret/path/model.gguf: permission denied")
	tests := []struct {
		name       string
		err        error
		wantCode   shardv1.ErrorCode
		wantDetail string
	}{
		{"sentinel", errSample, shardv1.ErrorCode_ERROR_CODE_PAYLOAD_CORRUPT, "test: sample refusal"},
		{"formatted", wireerr.Errorf(errSample, "offset %d", 42), shardv1.ErrorCode_ERROR_CODE_PAYLOAD_CORRUPT, "test: sample refusal: offset 42"},
		{"wrapped cause hidden", wireerr.Wrap(errSample, cause), shardv1.ErrorCode_ERROR_CODE_PAYLOAD_CORRUPT, "test: sample refusal: see worker log"},
		{"fmt wrapped", fmt.Errorf("stage: %w", errSample), shardv1.ErrorCode_ERROR_CODE_PAYLOAD_CORRUPT, "test: sample refusal"},
		{"raw error", cause, shardv1.ErrorCode_ERROR_CODE_INTERNAL, "internal error"},
		{"context cancelled", fmt.Errorf("open: %w", context.Canceled), shardv1.ErrorCode_ERROR_CODE_CANCELLED, "cancelled"},
		{"context deadline", context.DeadlineExceeded, shardv1.ErrorCode_ERROR_CODE_DEADLINE_EXCEEDED, "deadline exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := From(tt.err)
			if got.Code != tt.wantCode || got.Detail != tt.wantDetail {
				t.Fatalf("got (%v, %q), want (%v, %q)", got.Code, got.Detail, tt.wantCode, tt.wantDetail)
			}
			if Code(tt.err) != tt.wantCode {
				t.Fatalf("CodeOf %v, want %v", Code(tt.err), tt.wantCode)
			}
			if !errors.Is(tt.err, errSample) && tt.wantCode == shardv1.ErrorCode_ERROR_CODE_PAYLOAD_CORRUPT {
				t.Fatalf("errors.Is lost the sentinel")
			}
		})
	}
	if From(nil) != nil {
		t.Fatal("nil error must map to nil")
	}
}

func TestWrapKeepsCauseForLogs(t *testing.T) {
	cause := errors.New("zstd: bad magic")
	err := wireerr.Wrap(errSample, cause)
	if !errors.Is(err, cause) || !errors.Is(err, errSample) {
		t.Fatal("both sentinel and cause must be reachable")
	}
	if Code(err) != shardv1.ErrorCode_ERROR_CODE_PAYLOAD_CORRUPT {
		t.Fatal("wrong code")
	}
}
