package wireerr

import (
	"strings"
	"testing"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// TestCodesMatchContract: every Code is the generated ErrorCode of its
// name, and every contract code has one.
func TestCodesMatchContract(t *testing.T) {
	ours := map[Code]string{
		CodeUnspecified: "UNSPECIFIED", CodeSchemaUnsupported: "SCHEMA_UNSUPPORTED",
		CodeFingerprintMismatch: "FINGERPRINT_MISMATCH", CodeEpochStale: "EPOCH_STALE",
		CodeShardRangeMismatch: "SHARD_RANGE_MISMATCH", CodeCacheMiss: "CACHE_MISS",
		CodeResourceExhausted: "RESOURCE_EXHAUSTED", CodePayloadCorrupt: "PAYLOAD_CORRUPT",
		CodeCancelled: "CANCELLED", CodeDeadlineExceeded: "DEADLINE_EXCEEDED",
		CodeFlowControl: "FLOW_CONTROL_VIOLATION", CodeInternal: "INTERNAL",
	}
	if len(ours) != len(shardv1.ErrorCode_name) {
		t.Fatalf("%d codes here, %d in the contract", len(ours), len(shardv1.ErrorCode_name))
	}
	for c, name := range ours {
		if got := strings.TrimPrefix(shardv1.ErrorCode(c).String(), "ERROR_CODE_"); got != name {
			t.Errorf("Code %d is %s in the contract, %s here", c, got, name)
		}
	}
}

func TestDescribeBoundsDetail(t *testing.T) {
	e := New(CodePayloadCorrupt, "test: sample")
	_, _, d := Describe(Errorf(e, "%s", strings.Repeat("x", 1000)))
	if len(d) != maxDetail {
		t.Fatalf("detail of %d bytes", len(d))
	}
}
