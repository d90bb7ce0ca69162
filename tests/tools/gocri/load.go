// Load mode (gocri -load SPEC.json): what a kubelet does, on one grpc-go ClientConn, until
// stdin closes or SIGINT/SIGTERM arrives:
//
//   - Version and Status every poll_interval_ms (the kubelet's runtime health checks);
//   - ListPodSandbox and ListContainers every list_interval_ms (its relist);
//   - one worker per pod template running pod lifecycles back to back: RunPodSandbox,
//     PodSandboxStatus, CreateContainer, StartContainer, ContainerStatus, StopContainer,
//     RemoveContainer, StopPodSandbox, RemovePodSandbox;
//   - each stream of "streams" (a server stream: GetContainerEvents, containerd's event
//     Subscribe) kept open and re-opened after an error, as the kubelet re-opens its
//     GetContainerEvents stream; "direct" ones dial their own socket instead (a reference
//     to compare with).
//
// Requests are built here from the raw protobuf of the templates (field numbers of the
// CRI v1 messages), so no CRI stubs are needed. Output, one JSON line each:
//
//	{"kind":"fail","method":"...","code":14,"msg":"...","t":1700000000.123,"ms":5.1}
//	{"kind":"create","pod":0,"start":...,"end":...,"code":0,"container_id":"..."}
//	{"kind":"open","stream":"events","t":...}  {"kind":"closed","stream":"events","t":...,"code":14,"msg":"..."}
//	{"kind":"event","stream":"events","t":...,"key":"<sha1 of the message>"}
//	  (of a GetContainerEvents message: of its container id, event type and time only; the
//	  statuses it carries hold maps, which containerd 2.x's protobuf-go writes in a random
//	  order, so that two subscribers get the same event in different bytes)
//	{"kind":"call","method":"...","code":0,"t":...,"ms":...}   (every call, with "trace": true)
//	{"kind":"summary","ok":{"/runtime.v1.RuntimeService/Version":120,...},"failed":{...}}
//
// Every lifecycle removes what it made, also when a step failed (so a run ends clean).
package main

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/ioutil"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

const rt = "/runtime.v1.RuntimeService/"

type podTemplate struct {
	Sandbox   []byte `json:"sandbox_config"`   // PodSandboxConfig
	Container []byte `json:"container_config"` // ContainerConfig
}

type streamSpec struct {
	Name   string `json:"name"`
	Method string `json:"method"`
	Body   []byte `json:"body"`
	Socket string `json:"socket"` // "" = the load's socket
}

type loadSpec struct {
	Socket       string        `json:"socket"`
	DeadlineMs   int           `json:"deadline_ms"`
	PollMs       int           `json:"poll_interval_ms"`
	ListMs       int           `json:"list_interval_ms"`
	PauseMs      int           `json:"lifecycle_pause_ms"`
	StopTimeoutS int64         `json:"stop_timeout_s"`
	ReopenMs     int           `json:"reopen_ms"`
	Trace        bool          `json:"trace"` // one "call" line for every call, not only failed ones
	Pods         []podTemplate `json:"pods"`
	Streams      []streamSpec  `json:"streams"`
}

type loader struct {
	spec   loadSpec
	conn   *grpc.ClientConn
	out    sync.Mutex
	enc    *json.Encoder
	ok     map[string]int
	failed map[string]int
}

func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

func (l *loader) emit(v interface{}) {
	l.out.Lock()
	defer l.out.Unlock()
	if err := l.enc.Encode(v); err != nil {
		fail("stdout: %v", err)
	}
}

func dial(socket string) *grpc.ClientConn {
	conn, err := grpc.Dial(socket,
		grpc.WithInsecure(),
		grpc.WithAuthority("localhost"),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize), grpc.MaxCallSendMsgSize(maxMsgSize)))
	if err != nil {
		fail("dial %s: %v", socket, err)
	}
	return conn
}

// call makes one unary call; failed ones are reported with their time and code.
func (l *loader) call(method string, body []byte) ([]byte, uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(l.spec.DeadlineMs)*time.Millisecond)
	defer cancel()
	var reply []byte
	start := time.Now()
	err := l.conn.Invoke(ctx, method, &body, &reply, grpc.ForceCodec(rawCodec{}))
	st := status.Convert(err)
	l.out.Lock()
	if err == nil {
		l.ok[method]++
	} else {
		l.failed[method]++
	}
	l.out.Unlock()
	if l.spec.Trace {
		l.emit(map[string]interface{}{"kind": "call", "method": method, "code": uint32(st.Code()),
			"t": float64(start.UnixNano()) / 1e9, "ms": float64(time.Since(start).Nanoseconds()) / 1e6})
	}
	if err != nil {
		l.emit(map[string]interface{}{"kind": "fail", "method": method, "code": uint32(st.Code()),
			"msg": st.Message(), "t": float64(start.UnixNano()) / 1e9,
			"ms": float64(time.Since(start).Nanoseconds()) / 1e6})
	}
	return reply, uint32(st.Code())
}

// ---- protobuf by hand: length-delimited and varint fields, and field 1 of a reply.

func varint(v uint64) []byte {
	var b []byte
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func bytesField(n int, v []byte) []byte {
	return append(append(varint(uint64(n<<3|2)), varint(uint64(len(v)))...), v...)
}

func intField(n int, v int64) []byte { return append(varint(uint64(n<<3)), varint(uint64(v))...) }

// firstString is field 1 (a string) of a message: the id in RunPodSandboxResponse and
// CreateContainerResponse.
func firstString(msg []byte) string {
	i := 0
	for i < len(msg) {
		key, n := uvarint(msg[i:])
		if n <= 0 {
			return ""
		}
		i += n
		switch key & 7 {
		case 0:
			_, n = uvarint(msg[i:])
			i += n
		case 2:
			size, n := uvarint(msg[i:])
			i += n
			if key>>3 == 1 && i+int(size) <= len(msg) {
				return string(msg[i : i+int(size)])
			}
			i += int(size)
		default:
			return ""
		}
	}
	return ""
}

// eventIdentity is what names an event of stream method: the whole message, but for a
// GetContainerEvents one (ContainerEventResponse) only fields 1-3 (container_id,
// container_event_type, created_at), which containerd writes the same for every subscriber.
func eventIdentity(method string, msg []byte) []byte {
	if !strings.HasSuffix(method, "/GetContainerEvents") {
		return msg
	}
	var out []byte
	i := 0
	for i < len(msg) {
		start := i
		key, n := uvarint(msg[i:])
		if n <= 0 {
			return msg
		}
		i += n
		switch key & 7 {
		case 0:
			_, n = uvarint(msg[i:])
			if n <= 0 {
				return msg
			}
			i += n
		case 2:
			size, n := uvarint(msg[i:])
			if n <= 0 || i+n+int(size) > len(msg) {
				return msg
			}
			i += n + int(size)
		default:
			return msg
		}
		if key>>3 <= 3 {
			out = append(out, msg[start:i]...)
		}
	}
	return out
}

func uvarint(b []byte) (uint64, int) {
	var v uint64
	for i := 0; i < len(b) && i < 10; i++ {
		v |= uint64(b[i]&0x7f) << (7 * uint(i))
		if b[i] < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}

// ---- the loops

func (l *loader) every(ms int, stop <-chan struct{}, wg *sync.WaitGroup, f func()) {
	defer wg.Done()
	t := time.NewTicker(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	for {
		f()
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

func (l *loader) lifecycles(i int, p podTemplate, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		select {
		case <-stop:
			return
		default:
		}
		pause := time.Duration(l.spec.PauseMs) * time.Millisecond
		if !l.lifecycle(i, p) && pause < 250*time.Millisecond {
			pause = 250 * time.Millisecond // (a failed step: the kubelet backs off too)
		}
		select {
		case <-stop:
			return
		case <-time.After(pause):
		}
	}
}

// lifecycle runs one pod's life; false when a step failed.
func (l *loader) lifecycle(i int, p podTemplate) bool {
	reply, code := l.call(rt+"RunPodSandbox", bytesField(1, p.Sandbox))
	sandbox := firstString(reply)
	if code != 0 || sandbox == "" {
		return false
	}
	defer l.teardown(rt+"StopPodSandbox", bytesField(1, []byte(sandbox)), rt+"RemovePodSandbox",
		bytesField(1, []byte(sandbox)))
	l.call(rt+"PodSandboxStatus", bytesField(1, []byte(sandbox)))
	req := append(append(bytesField(1, []byte(sandbox)), bytesField(2, p.Container)...), bytesField(3, p.Sandbox)...)
	start := now()
	reply, code = l.call(rt+"CreateContainer", req)
	container := firstString(reply)
	l.emit(map[string]interface{}{"kind": "create", "pod": i, "start": start, "end": now(), "code": code,
		"sandbox_id": sandbox, "container_id": container})
	if code != 0 || container == "" {
		return false
	}
	id := bytesField(1, []byte(container))
	_, code = l.call(rt+"StartContainer", id)
	l.call(rt+"ContainerStatus", id)
	l.teardown(rt+"StopContainer", append(bytesField(1, []byte(container)), intField(2, l.spec.StopTimeoutS)...),
		rt+"RemoveContainer", id)
	return code == 0
}

// teardown stops, then removes, until the remove succeeds (or what it removes is gone), as
// the kubelet's sync loop does, so that a failed call leaves nothing behind. Each retry stops
// again: a StartContainer still finishing in containerd (one a kill cut) makes the first stop
// a no-op on a container not yet running, and the remove then finds its task running.
func (l *loader) teardown(stop string, stopBody []byte, remove string, removeBody []byte) {
	for i := 0; i < 40; i++ {
		if _, code := l.call(stop, stopBody); code == 0 || code == 5 { // OK, NOT_FOUND
			if _, code = l.call(remove, removeBody); code == 0 || code == 5 {
				return
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// watch keeps a server stream open, re-opening it after an error.
func (l *loader) watch(s streamSpec, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	conn := l.conn
	if s.Socket != "" && s.Socket != l.spec.Socket {
		conn = dial(s.Socket)
		defer conn.Close()
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-stop; cancel() }()
	desc := &grpc.StreamDesc{StreamName: s.Name, ServerStreams: true}
	for ctx.Err() == nil {
		stream, err := conn.NewStream(ctx, desc, s.Method, grpc.ForceCodec(rawCodec{}))
		if err == nil {
			err = stream.SendMsg(&s.Body)
		}
		if err == nil {
			err = stream.CloseSend()
		}
		if err == nil {
			l.emit(map[string]interface{}{"kind": "open", "stream": s.Name, "t": now()})
			for {
				var msg []byte
				if err = stream.RecvMsg(&msg); err != nil {
					break
				}
				sum := sha1.Sum(eventIdentity(s.Method, msg))
				l.emit(map[string]interface{}{"kind": "event", "stream": s.Name, "t": now(),
					"key": hex.EncodeToString(sum[:])})
			}
		}
		if ctx.Err() != nil {
			return
		}
		st := status.Convert(err)
		l.emit(map[string]interface{}{"kind": "closed", "stream": s.Name, "t": now(), "code": uint32(st.Code()),
			"msg": st.Message()})
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(l.spec.ReopenMs) * time.Millisecond):
		}
	}
}

func runLoad(path string) {
	raw, err := ioutil.ReadFile(path)
	if err != nil {
		fail("%v", err)
	}
	l := &loader{enc: json.NewEncoder(os.Stdout), ok: map[string]int{}, failed: map[string]int{}}
	if err := json.Unmarshal(raw, &l.spec); err != nil {
		fail("%s: %v", path, err)
	}
	if l.spec.DeadlineMs <= 0 {
		l.spec.DeadlineMs = 120000 // the kubelet's runtime-request-timeout
	}
	if l.spec.PollMs <= 0 {
		l.spec.PollMs = 100
	}
	if l.spec.ListMs <= 0 {
		l.spec.ListMs = 1000
	}
	if l.spec.ReopenMs <= 0 {
		l.spec.ReopenMs = 100
	}
	l.conn = dial(l.spec.Socket)
	defer l.conn.Close()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range l.spec.Streams {
		wg.Add(1)
		go l.watch(s, stop, &wg)
	}
	wg.Add(2)
	go l.every(l.spec.PollMs, stop, &wg, func() {
		l.call(rt+"Version", bytesField(1, []byte("v1")))
		l.call(rt+"Status", nil)
	})
	go l.every(l.spec.ListMs, stop, &wg, func() {
		l.call(rt+"ListPodSandbox", nil)
		l.call(rt+"ListContainers", nil)
	})
	for i, p := range l.spec.Pods {
		wg.Add(1)
		go l.lifecycles(i, p, stop, &wg)
	}
	l.emit(map[string]interface{}{"kind": "started", "t": now()})

	// Until stdin closes (the driver ends) or a signal asks to stop.
	done := make(chan struct{})
	go func() {
		ioutil.ReadAll(os.Stdin)
		close(done)
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-done:
	case <-sigs:
	}
	close(stop)
	wg.Wait()
	l.out.Lock()
	summary := map[string]interface{}{"kind": "summary", "t": now(), "ok": l.ok, "failed": l.failed}
	l.out.Unlock()
	l.emit(summary)
	fmt.Fprintln(os.Stderr, "gocri: load done")
}
