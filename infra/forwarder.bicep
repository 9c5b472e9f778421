// Install the forwarder on existing Linux VMs and scale sets of one resource group: attach the
// forwarders' user-assigned identity and run infra/scripts/install-forwarder.sh through the
// Custom Script Extension. Deploy once per resource group that holds VMs (README, Deploy);
// the values come from the outputs of main.bicep.

targetScope = 'resourceGroup'

@description('Names of existing Linux VMs in this resource group.')
param vmNames array = []

@description('Names of existing Linux virtual machine scale sets in this resource group.')
param vmssNames array = []

@description('Resource id of the forwarders\' user-assigned identity (output forwarderIdentityResourceId of main.bicep).')
param forwarderIdentityResourceId string

@description('Client id of that identity (output forwarderIdentityClientId), written as AZURE_CLIENT_ID.')
param forwarderIdentityClientId string

@description('Fully qualified Service Bus namespace (output serviceBusNamespace), written as SEBRIDGE_NAMESPACE.')
param serviceBusNamespace string

@description('What pip installs on the VM: a requirement spec resolved against the VM\'s package index (default, the released version), or the https URL of a wheel you host. Must not contain credentials: it is visible to anyone who can read the extension\'s status.')
param packageSource string = 'scheduled-events-bridge==0.1.0'

@description('Attach the identity to each VM and scale set (merged with the identities they already have). False if you attach it yourself (az vm identity assign).')
param attachIdentity bool = true

@description('Change to rerun the installer with unchanged settings (e.g. to pick up a new build behind the same packageSource).')
param forceUpdateTag string = ''

// The script and the unit travel inside the command, base64-encoded: the VM runs exactly the
// files of this commit, needs no download location, and no value can break the shell quoting.
var scriptBase64 = loadFileAsBase64('scripts/install-forwarder.sh')
var unitBase64 = loadFileAsBase64('scripts/sebridge-forwarder.service')
var installCommand = 'mkdir -p sebridge && cd sebridge && echo ${scriptBase64} | base64 -d > install-forwarder.sh && echo ${unitBase64} | base64 -d > sebridge-forwarder.service && SEBRIDGE_NAMESPACE="$(echo ${base64(serviceBusNamespace)} | base64 -d)" AZURE_CLIENT_ID="$(echo ${base64(forwarderIdentityClientId)} | base64 -d)" SEBRIDGE_PACKAGE="$(echo ${base64(packageSource)} | base64 -d)" bash install-forwarder.sh'
// The extension reruns whenever what it would install changes.
var updateTag = empty(forceUpdateTag) ? uniqueString(installCommand) : forceUpdateTag

module vms 'modules/forwarder-vm.bicep' = [for name in vmNames: {
  name: 'sebridge-forwarder-vm-${name}'
  params: {
    vmName: name
    forwarderIdentityResourceId: forwarderIdentityResourceId
    attachIdentity: attachIdentity
    installCommand: installCommand
    forceUpdateTag: updateTag
  }
}]

module scaleSets 'modules/forwarder-vmss.bicep' = [for name in vmssNames: {
  name: 'sebridge-forwarder-vmss-${name}'
  params: {
    vmssName: name
    forwarderIdentityResourceId: forwarderIdentityResourceId
    attachIdentity: attachIdentity
    installCommand: installCommand
    forceUpdateTag: updateTag
  }
}]
