// Command gocri drives a CRI endpoint with grpc-go, the gRPC stack the kubelet uses.
//
// It dials one unix socket the way the kubelet does (insecure, authority "localhost",
// default transport settings: no custom window or frame sizes, 16 MiB message limits)
// and invokes one full method name, e.g. /runtime.v1.RuntimeService/CreateContainer,
// once per request file, all calls at once over that single HTTP/2 connection. Request
// files hold raw protobuf bytes and replies come back raw: a pass-through codec means no
// CRI stubs are needed here. One JSON line per call goes to stdout:
//
//	{"index":0,"code":0,"message":"","elapsed_ms":1.25,"reply_b64":"..."}
//
// code is the numeric gRPC status code. The exit status is 0 when every call was made
// (whatever their codes), 2 on bad usage or when the socket could not be dialled.
//
//	gocri -socket /run/x.sock -method /runtime.v1.RuntimeService/Version -deadline 5s a.bin b.bin
//	gocri -socket /run/x.sock -method ... -repeat 1000 -serial a.bin   # a latency loop
//	gocri -load spec.json   # a kubelet's load until stdin closes (load.go)
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/ioutil"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

const maxMsgSize = 16 << 20 // what the kubelet allows both ways

// rawCodec passes request and reply bytes through untouched. It is forced on each call
// with grpc.ForceCodec, which in grpc-go 1.33 leaves the content-type "application/grpc",
// as the kubelet sends it (named "proto" so newer grpc-go would still say "+proto").
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// result is one output line; []byte marshals as base64.
type result struct {
	Index     int     `json:"index"`
	Code      uint32  `json:"code"`
	Message   string  `json:"message"`
	ElapsedMs float64 `json:"elapsed_ms"`
	Reply     []byte  `json:"reply_b64"`
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "gocri: "+format+"\n", args...)
	os.Exit(2)
}

func main() {
	socket := flag.String("socket", "", "unix socket path to dial")
	method := flag.String("method", "", "full method name, /package.Service/Method")
	deadline := flag.Duration("deadline", 10*time.Second, "deadline of each call")
	connect := flag.Duration("connect-timeout", 5*time.Second, "how long to wait for the connection")
	repeat := flag.Int("repeat", 1, "make the calls of all request files this many times")
	serial := flag.Bool("serial", false, "one call after another instead of all at once")
	load := flag.String("load", "", "a load spec (JSON): run what a kubelet does until stdin closes (load.go)")
	flag.Parse()
	if *load != "" {
		runLoad(*load)
		return
	}
	if *socket == "" || *method == "" || flag.NArg() == 0 || *repeat < 1 {
		fail("usage: gocri -socket PATH -method /pkg.Service/Method [-deadline 10s] [-repeat N] [-serial] REQUEST_FILE...")
	}
	bodies := make([][]byte, flag.NArg())
	for i, name := range flag.Args() {
		b, err := ioutil.ReadFile(name)
		if err != nil {
			fail("%v", err)
		}
		bodies[i] = b
	}

	// Dial like the kubelet's remote runtime client; WithBlock only so that the calls
	// start on a connection that is up (and their times leave out the connect).
	ctx, cancel := context.WithTimeout(context.Background(), *connect)
	conn, err := grpc.DialContext(ctx, *socket,
		grpc.WithInsecure(),
		grpc.WithAuthority("localhost"),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", *socket)
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize), grpc.MaxCallSendMsgSize(maxMsgSize)))
	cancel()
	if err != nil {
		fail("dial %s: %v", *socket, err)
	}
	defer conn.Close()

	var out sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	call := func(index int, body []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), *deadline)
		defer cancel()
		var reply []byte
		start := time.Now()
		err := conn.Invoke(ctx, *method, &body, &reply, grpc.ForceCodec(rawCodec{}))
		elapsed := time.Since(start)
		st := status.Convert(err) // nil error: code OK
		r := result{Index: index, Code: uint32(st.Code()), Message: st.Message(),
			ElapsedMs: float64(elapsed.Nanoseconds()) / 1e6, Reply: reply}
		out.Lock()
		defer out.Unlock()
		if err := enc.Encode(&r); err != nil {
			fail("stdout: %v", err)
		}
	}

	var wg sync.WaitGroup
	for r := 0; r < *repeat; r++ {
		for i, body := range bodies {
			index := r*len(bodies) + i
			if *serial {
				call(index, body)
				continue
			}
			wg.Add(1)
			go func(index int, body []byte) {
				defer wg.Done()
				call(index, body)
			}(index, body)
		}
	}
	wg.Wait()
}
