module konnectivity-interop-upstream-suite

go 1.26.2

require (
	sigs.k8s.io/apiserver-network-proxy v0.36.0
	sigs.k8s.io/apiserver-network-proxy/konnectivity-client v0.36.0
)
