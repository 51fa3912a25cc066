package goharness

import (
	"fmt"
	"net"
	"syscall"
	"time"
)

// boundLoopback is a TCP socket bound to a free port on 127.0.0.1, not yet
// listening.
func boundLoopback() (fd int, addr string, err error) {
	fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, "", err
	}
	if err = syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err == nil {
		var sa syscall.Sockaddr
		if sa, err = syscall.Getsockname(fd); err == nil {
			return fd, Loopback(sa.(*syscall.SockaddrInet4).Port), nil
		}
	}
	syscall.Close(fd)
	return -1, "", err
}

// RefusedAddr is a loopback port that refuses connections: bound, never
// listened on, kept bound until release so nobody else takes it.
func RefusedAddr() (addr string, release func(), err error) {
	fd, addr, err := boundLoopback()
	if err != nil {
		return "", nil, err
	}
	return addr, func() { syscall.Close(fd) }, nil
}

// BlackholeAddr never completes a TCP handshake, on loopback: a listener
// with backlog 0 whose accept queue is filled and never accepted, so the
// kernel drops further SYNs and a dialer waits for its own timeout. It
// holds until release.
func BlackholeAddr() (addr string, release func(), err error) {
	fd, addr, err := boundLoopback()
	if err != nil {
		return "", nil, err
	}
	var held []net.Conn
	release = func() {
		for _, c := range held {
			c.Close()
		}
		syscall.Close(fd)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		release()
		return "", nil, err
	}
	// Fill the accept queue until a handshake stops completing.
	for range 16 {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			return addr, release, nil
		}
		held = append(held, c)
	}
	release()
	return "", nil, fmt.Errorf("blackhole %s still completes handshakes after 16 connections", addr)
}
