package engine

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/status"

	"github.com/meshnet/shardd/frames"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/feature"
	"github.com/meshnet/shardd/internal/recipe"
	"github.com/meshnet/shardd/internal/sharderr"
	"github.com/meshnet/shardd/stages/decode"
)

// ServerOptions are the gRPC options the ShardRuntime server needs: the
// zero-copy codec (forced on this server only, never registered globally),
// the shared buffer pool, and message limits from the flow-control budget.
func (e *Engine) ServerOptions() []grpc.ServerOption {
	limit := e.maxMessageBytes()
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(decode.Codec{Pool: e.pool}),
		experimental.BufferPool(e.pool),
		grpc.MaxRecvMsgSize(limit),
		grpc.MaxSendMsgSize(limit),
		// A static HTTP/2 window large enough for a whole chunk: with gRPC's
		// default (64 KiB, grown by BDP probing) a message larger than the
		// window waits a WINDOW_UPDATE round trip. Credits, not the window,
		// bound what a peer may have queued here.
		grpc.InitialWindowSize(int32(min(limit, 1<<30))),
		grpc.InitialConnWindowSize(int32(min(2*limit, 1<<30))),
		grpc.WriteBufferSize(256 << 10), grpc.ReadBufferSize(256 << 10),
	}
}

// maxMessageBytes bounds a received message: the largest chunk the flow
// control allows, plus room for its envelope.
func (e *Engine) maxMessageBytes() int { return int(e.cfg.MaxChunkBytes) + 64<<10 }

// FrameServer serves this engine on frame connections (a relayed hop,
// package frames): the same handlers, codec and buffer pool as the gRPC
// server, and the same message limit.
func (e *Engine) FrameServer(log *slog.Logger) *frames.Server {
	return frames.NewServer(e, frames.Config{Codec: decode.Codec{Pool: e.pool}, Pool: e.pool, MaxRecv: e.maxMessageBytes(), Log: log})
}

// GetCapability reports what this worker can execute, proven by the
// start-up forward.
func (e *Engine) GetCapability(ctx context.Context, req *shardv1.CapabilityRequest) (*shardv1.CapabilityReport, error) {
	r := &shardv1.CapabilityReport{
		SchemaVersion:           shardv1.SchemaVersion_SCHEMA_VERSION_1,
		Fingerprint:             e.id.Fingerprint,
		ShardRange:              e.id.Range,
		Backend:                 strings.Join(e.recipe.Lines(), recipe.Sep),
		Device:                  e.info.Device,
		Validated:               e.validated,
		Detail:                  feature.Advertise(e.detail, e.features),
		MaxConcurrentSessions:   uint64(e.cfg.MaxSessions),
		MaxContextTokens:        uint64(e.info.CtxTokens),
		FlowControl:             e.negotiate(nil).proto(),
		AcceptedCompression:     []shardv1.Compression{shardv1.Compression_COMPRESSION_NONE, shardv1.Compression_COMPRESSION_ZSTD},
		SupportedSchemaVersions: []shardv1.SchemaVersion{shardv1.SchemaVersion_SCHEMA_VERSION_1},
	}
	if e.validated {
		r.ValidatedAtUnixNanos = e.validatedAt.UnixNano()
	}
	return r, nil
}

// Health reports live load.
func (e *Engine) Health(ctx context.Context, req *shardv1.HealthRequest) (*shardv1.HealthReport, error) {
	st := e.Stats()
	r := &shardv1.HealthReport{
		SchemaVersion:  shardv1.SchemaVersion_SCHEMA_VERSION_1,
		State:          e.State(),
		ActiveSessions: uint32(st.Sessions),
		QueuedChunks:   uint32(max(e.queued.Load(), 0)),
		BatchOccupancy: uint32(st.Occupancy),
		KvPressure:     float32(st.Pressure),
		ResidentBytes:  residentBytes(),
		Detail:         e.detail,
	}
	return r, nil
}

// Release drops a session's state out of band. Idempotent.
func (e *Engine) Release(ctx context.Context, req *shardv1.ReleaseRequest) (*shardv1.ReleaseResponse, error) {
	if req.SchemaVersion != shardv1.SchemaVersion_SCHEMA_VERSION_1 {
		return nil, statusError(codes.FailedPrecondition, ErrSchema)
	}
	id := strings.Clone(req.RouteSessionId)
	var released bool
	var rerr error
	if err := e.do(ctx, func() { released, rerr = e.sched.Release(e.drv.clock(), id, req.RouteEpoch) }); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	if rerr != nil {
		return &shardv1.ReleaseResponse{Error: sharderr.From(rerr)}, statusError(codes.FailedPrecondition, rerr)
	}
	return &shardv1.ReleaseResponse{Released: released}, nil
}

// Cancel abandons queued work on a fresh call, so it works even while the
// session's stream is wedged behind flow control.
func (e *Engine) Cancel(ctx context.Context, req *shardv1.CancelRequest) (*shardv1.CancelResponse, error) {
	if req.SchemaVersion != shardv1.SchemaVersion_SCHEMA_VERSION_1 {
		return nil, statusError(codes.FailedPrecondition, ErrSchema)
	}
	id, workID := strings.Clone(req.RouteSessionId), strings.Clone(req.WorkId)
	var n int
	if err := e.do(ctx, func() { n = e.sched.Cancel(e.drv.clock(), id, req.RouteEpoch, workID) }); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	return &shardv1.CancelResponse{CancelledWorkItems: uint32(n)}, nil
}

// statusError is a gRPC status whose details carry the ShardError, for
// unary RPCs.
func statusError(c codes.Code, err error) error {
	se := sharderr.From(err)
	st, derr := status.New(c, se.Detail).WithDetails(se)
	if derr != nil {
		return status.Error(c, se.Detail)
	}
	return st.Err()
}

// residentBytes reads the process's resident set size.
func residentBytes() uint64 {
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(data))
	if len(fields) < 2 {
		return 0
	}
	pages, _ := strconv.ParseUint(fields[1], 10, 64)
	return pages * uint64(os.Getpagesize())
}
