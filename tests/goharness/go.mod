module konnectivity-goharness

go 1.26.2
