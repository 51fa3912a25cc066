// Command kubelet is a kubelet stand-in for the test harness. It registers a
// Node whose only address is --address (an address that kube-apiserver is
// meant to reach through the Konnectivity tunnel), marks the Pods bound to
// that Node as Running, and serves the parts of the kubelet API that
// kube-apiserver proxies for kubectl, on TLS with client certificates:
//
//	/containerLogs/{ns}/{pod}/{container}     three lines; ?follow=true then ticks until the client goes away
//	/exec/{ns}/{pod}[/{uid}]/{container}      via k8s.io/cri-streaming's remotecommand (SPDY and WebSocket)
//	/portForward/{ns}/{pod}[/{uid}]           via k8s.io/cri-streaming's portforward; a forwarded port P is 127.0.0.1:P
//
// Containers understand a few commands (see exec below). When ready it prints
// "kubelet ready addr=HOST:PORT node=NAME". Events worth asserting on are
// printed to stdout as "event: ...".
package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

var stdout sync.Mutex

func event(format string, args ...any) {
	stdout.Lock()
	defer stdout.Unlock()
	fmt.Printf("event: "+format+"\n", args...)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig for registering the Node and updating Pods")
	nodeName := flag.String("node-name", "standin", "Node name")
	address := flag.String("address", "127.0.0.2", "address to serve on; the Node's InternalIP")
	port := flag.Int("port", 0, "port to serve on (0: any)")
	certFile := flag.String("tls-cert-file", "", "serving certificate")
	keyFile := flag.String("tls-private-key-file", "", "serving key")
	clientCA := flag.String("client-ca-file", "", "CA for client certificates (kube-apiserver's kubelet client cert)")
	flag.Parse()
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0)
	if err := run(*kubeconfig, *nodeName, *address, *port, *certFile, *keyFile, *clientCA); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet stand-in: %v\n", err)
		os.Exit(1)
	}
}

func run(kubeconfig, nodeName, address string, port int, certFile, keyFile, clientCA string) error {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(clientCA)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return errors.New("no certificates in --client-ca-file")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(port)))
	if err != nil {
		return err
	}
	bound := ln.Addr().(*net.TCPAddr)
	tlsLn := tls.NewListener(ln, &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"http/1.1"},
	})

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	if err := register(ctx, client, nodeName, address, int32(bound.Port)); err != nil {
		return fmt.Errorf("registering node: %w", err)
	}
	go markPodsRunning(ctx, client, nodeName, address)

	srv := &http.Server{Handler: handler(), ReadHeaderTimeout: 30 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	stdout.Lock()
	fmt.Printf("kubelet ready addr=%s node=%s\n", bound, nodeName)
	stdout.Unlock()
	if err := srv.Serve(tlsLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func register(ctx context.Context, client kubernetes.Interface, name, address string, port int32) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
	}
	created, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return err
	}
	now := metav1.Now()
	created.Status = corev1.NodeStatus{
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: address}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: port}},
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now,
		}},
	}
	_, err = client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

// markPodsRunning sets every Pod bound to this Node to Running with ready
// containers, which `kubectl port-forward` insists on.
func markPodsRunning(ctx context.Context, client kubernetes.Interface, node, address string) {
	selector := fields.OneTermEqualSelector("spec.nodeName", node).String()
	for ctx.Err() == nil {
		w, err := client.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || pod.Status.Phase == corev1.PodRunning || pod.DeletionTimestamp != nil {
				continue
			}
			now := metav1.Now()
			pod.Status.Phase = corev1.PodRunning
			pod.Status.PodIP = address
			pod.Status.HostIP = address
			pod.Status.StartTime = &now
			pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			pod.Status.ContainerStatuses = nil
			for _, c := range pod.Spec.Containers {
				pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
					Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: boolPtr(true),
					ContainerID: "standin://" + pod.Name + "/" + c.Name,
					State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
				})
			}
			if _, err := client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
				fmt.Fprintf(os.Stderr, "updating pod %s/%s: %v\n", pod.Namespace, pod.Name, err)
				continue
			}
			event("pod running %s/%s", pod.Namespace, pod.Name)
		}
	}
}

func boolPtr(b bool) *bool { return &b }

func handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{ns}/{pod}/{container}", containerLogs)
	for _, p := range []string{"/exec/{ns}/{pod}/{container}", "/exec/{ns}/{pod}/{uid}/{container}"} {
		mux.HandleFunc("GET "+p, execHandler)
		mux.HandleFunc("POST "+p, execHandler)
	}
	for _, p := range []string{"/portForward/{ns}/{pod}", "/portForward/{ns}/{pod}/{uid}"} {
		mux.HandleFunc("GET "+p, portForwardHandler)
		mux.HandleFunc("POST "+p, portForwardHandler)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	return mux
}

func containerLogs(w http.ResponseWriter, r *http.Request) {
	ns, pod, container := r.PathValue("ns"), r.PathValue("pod"), r.PathValue("container")
	follow := r.URL.Query().Get("follow") == "true"
	w.Header().Set("Content-Type", "text/plain")
	for i := 1; i <= 3; i++ {
		fmt.Fprintf(w, "log line %d from %s/%s/%s\n", i, ns, pod, container)
	}
	if !follow {
		return
	}
	event("logs follow started %s/%s/%s", ns, pod, container)
	flusher, _ := w.(http.Flusher)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for n := 1; ; n++ {
		if flusher != nil {
			flusher.Flush()
		}
		select {
		case <-r.Context().Done():
			event("logs follow ended %s/%s/%s after %d ticks", ns, pod, container, n-1)
			return
		case <-tick.C:
			if _, err := fmt.Fprintf(w, "tick %d\n", n); err != nil {
				event("logs follow ended %s/%s/%s after %d ticks", ns, pod, container, n-1)
				return
			}
		}
	}
}

func execHandler(w http.ResponseWriter, r *http.Request) {
	opts, err := remotecommand.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cmd := r.URL.Query()["command"]
	event("exec %s/%s/%s %q", r.PathValue("ns"), r.PathValue("pod"), r.PathValue("container"), cmd)
	remotecommand.ServeExec(w, r, executor{}, r.PathValue("ns")+"/"+r.PathValue("pod"), r.PathValue("uid"),
		r.PathValue("container"), cmd, opts, 5*time.Minute, 30*time.Second, remotecommand.SupportedStreamingProtocols)
}

// executor runs the stand-in's commands:
//
//	cat          copies stdin to stdout
//	sha256       reads stdin to the end and prints "<hex> <bytes>"
//	echo ARGS    prints ARGS
//	exit N       exits with code N
//	sleep-forever  blocks until the stream goes away
type executor struct{}

func (executor) ExecInContainer(ctx context.Context, _ string, _ string, _ string, cmd []string, in io.Reader, out, errOut io.WriteCloser, _ bool, _ <-chan remotecommand.TerminalSize, _ time.Duration) error {
	if len(cmd) == 0 {
		return errors.New("no command")
	}
	switch cmd[0] {
	case "cat":
		if in == nil || out == nil {
			return errors.New("cat needs stdin and stdout")
		}
		_, err := io.Copy(out, in)
		return err
	case "sha256":
		if in == nil || out == nil {
			return errors.New("sha256 needs stdin and stdout")
		}
		h := sha256.New()
		n, err := io.Copy(h, in)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s %d\n", hex.EncodeToString(h.Sum(nil)), n)
		return err
	case "echo":
		if out == nil {
			return nil
		}
		_, err := fmt.Fprintln(out, strings.Join(cmd[1:], " "))
		return err
	case "exit":
		code := 1
		if len(cmd) > 1 {
			if c, err := strconv.Atoi(cmd[1]); err == nil {
				code = c
			}
		}
		if errOut != nil {
			fmt.Fprintf(errOut, "exiting with %d\n", code)
		}
		if code == 0 {
			return nil
		}
		return utilexec.CodeExitError{Err: fmt.Errorf("command exited with %d", code), Code: code}
	case "sleep-forever":
		<-ctx.Done()
		return nil
	default:
		if errOut != nil {
			fmt.Fprintf(errOut, "%s: command not found\n", cmd[0])
		}
		return utilexec.CodeExitError{Err: fmt.Errorf("%s: command not found", cmd[0]), Code: 127}
	}
}

func portForwardHandler(w http.ResponseWriter, r *http.Request) {
	opts, err := portforward.NewV4Options(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	event("portforward %s/%s", r.PathValue("ns"), r.PathValue("pod"))
	portforward.ServePortForward(w, r, forwarder{}, r.PathValue("ns")+"/"+r.PathValue("pod"), r.PathValue("uid"),
		opts, 5*time.Minute, 30*time.Second, portforward.SupportedProtocols)
}

// forwarder connects a forwarded pod port P to 127.0.0.1:P.
type forwarder struct{}

func (forwarder) PortForward(ctx context.Context, _ string, _ string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		return err
	}
	defer conn.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(conn, stream); _ = conn.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(stream, conn); done <- struct{}{} }()
	<-done
	<-done
	return nil
}
